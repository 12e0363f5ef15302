// The x86-64 vector instruction sets the CPU kernels (CPU Adam, block quantization) are written for, and
// which of them this CPU runs, decided once at run time with cpuid.
#pragma once

#include <string_view>

namespace zero3 {

// Instruction set of a vector body. `best` picks the widest one the CPU supports.
enum class CpuIsa { scalar, avx2, avx512, best };

std::string_view cpu_isa_name(CpuIsa isa);

// The ISA `best` resolves to on this CPU: avx512 needs AVX-512F/BW/VL; avx2 needs AVX2 and F16C.
CpuIsa cpu_isa_detect();

// True when this CPU can run `isa` (scalar and best: always).
bool cpu_isa_supported(CpuIsa isa);

}  // namespace zero3

// The per-ISA bodies of cpu_adam_step, each over one contiguous chunk on the calling thread: a vector body
// plus the scalar tail. cpu_adam.cpp picks one and splits the work over threads.
#pragma once

#include <cstddef>

#include "optim/adam_math.hpp"
#include "zero3/dtype.hpp"

namespace zero3::detail {

using AdamChunkFn = void (*)(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c,
                             void* copy_out, DType copy_dtype);

void adam_chunk_scalar(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out,
                       DType copy_dtype);

// Defined only on x86-64; callers check the CPU first (cpu_isa_supported).
void adam_chunk_avx2(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out,
                     DType copy_dtype);
void adam_chunk_avx512(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out,
                       DType copy_dtype);

}  // namespace zero3::detail

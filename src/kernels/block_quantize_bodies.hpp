// The per-ISA bodies of the CPU block quantization, each over the elements of one block on the calling
// thread: a vector body plus the scalar tail. block_quantize_cpu.cpp picks one set and runs it per block.
#pragma once

#include <cstdint>

#include "zero3/dtype.hpp"

namespace zero3::detail {

struct QuantBodies {
  // The maximum of quant_abs_bits over n elements of type t.
  uint32_t (*absmax_bits)(const void* src, DType t, int64_t n);
  // The codes of n elements of type t for a factor inv > 0: n bytes (int8) or ceil(n/2) bytes (int4).
  void (*encode)(uint8_t* codes, const void* src, DType t, int64_t n, float inv, int bits);
  // dst[i] = dequant_value(code i, scale) rounded to t, for n elements.
  void (*decode)(void* dst, DType t, const uint8_t* codes, int64_t n, float scale, int bits);
  // acc[i] += dequant_value(code i, scale), for n elements.
  void (*decode_add)(float* acc, const uint8_t* codes, int64_t n, float scale, int bits);
};

extern const QuantBodies kQuantBodiesScalar;
// Defined only on x86-64; callers check the CPU first (cpu_isa_supported).
extern const QuantBodies kQuantBodiesAvx2;
extern const QuantBodies kQuantBodiesAvx512;

}  // namespace zero3::detail

// Block quantization on the CPU (the format and its rules: kernels/block_quantize.hpp).
//
// Each call splits its blocks over OpenMP threads (below 32768 elements it runs on the calling thread) and
// returns when it is done. Every block runs the vector body of `isa`: AVX-512 and AVX2 give the bits of the
// scalar reference, messages and dequantized values alike. A specific ISA this CPU lacks is an Unsupported
// error; `best` never fails. Bad arguments (check_quant_args) throw InvalidArgument before anything is
// written. Buffers must not overlap.
#pragma once

#include <cstdint>

#include "core/cpu_isa.hpp"
#include "kernels/block_quantize.hpp"
#include "zero3/dtype.hpp"

namespace zero3 {

// `chunks` chunks of `chunk` elements of src_type, back to back in src, become their messages, back to back
// in dst (quant_message_bytes(chunk, f) bytes each, padding included).
void quantize_cpu(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                  CpuIsa isa = CpuIsa::best);

// The inverse: dst[c * chunk + i] = element i of message c, rounded to dst_type.
void dequantize_cpu(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                    CpuIsa isa = CpuIsa::best);

// dst[i] (chunk floats) = the fp32 sum over c = 0, 1, ..., chunks - 1, in that order and starting from +0,
// of element i of message c: the receiving side of a quantized all-to-all reduction.
void dequantize_sum_cpu(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                        CpuIsa isa = CpuIsa::best);

}  // namespace zero3

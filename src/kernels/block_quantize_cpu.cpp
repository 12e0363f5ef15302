#include "kernels/block_quantize_cpu.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.hpp"
#include "kernels/block_quantize_bodies.hpp"
#include "kernels/elementwise.hpp"
#include "zero3/error.hpp"

namespace zero3 {

void check_quant_args(const char* op, const QuantFormat& f, int64_t chunk, int64_t chunks) {
  ZERO3_REQUIRE(f.bits == 8 || f.bits == 4, InvalidArgument, op, ": bits = ", f.bits, ", expected 8 or 4");
  ZERO3_REQUIRE(f.block >= 1, InvalidArgument, op, ": block = ", f.block, " elements, expected at least 1");
  ZERO3_REQUIRE(f.bits == 8 || f.block % 2 == 0, InvalidArgument, op, ": block = ", f.block,
                " elements with int4, expected an even block (two codes share a byte)");
  ZERO3_REQUIRE(chunk >= 0 && chunks >= 0, InvalidArgument, op, ": chunk = ", chunk, " elements, chunks = ", chunks,
                ", expected both >= 0");
}

namespace detail {
namespace {

// The scalar reference, one template instance per element type so that each loop is a plain loop.

template <DType T>
uint32_t absmax_bits_t(const void* src, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, quant_abs_bits(load_as_f32<T>(src, i)));
  return m;
}

template <DType T>
void encode_t(uint8_t* codes, const void* src, int64_t n, float inv, int bits) {
  if (bits == 8) {
    for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(quant_code(load_as_f32<T>(src, i), inv, 8));
    return;
  }
  for (int64_t i = 0; i < n; i += 2) {
    int32_t even = quant_code(load_as_f32<T>(src, i), inv, 4);
    int32_t odd = i + 1 < n ? quant_code(load_as_f32<T>(src, i + 1), inv, 4) : 0;
    codes[i / 2] = quant_pack_int4(even, odd);
  }
}

template <DType T>
void decode_t(void* dst, const uint8_t* codes, int64_t n, float scale, int bits) {
  for (int64_t i = 0; i < n; ++i) store_from_f32<T>(dst, i, dequant_value(quant_code_at(codes, i, bits), scale));
}

uint32_t absmax_bits_scalar(const void* src, DType t, int64_t n) {
  switch (t) {
    case DType::f32:
      return absmax_bits_t<DType::f32>(src, n);
    case DType::bf16:
      return absmax_bits_t<DType::bf16>(src, n);
    case DType::f16:
      return absmax_bits_t<DType::f16>(src, n);
  }
  return 0;
}

void encode_scalar(uint8_t* codes, const void* src, DType t, int64_t n, float inv, int bits) {
  switch (t) {
    case DType::f32:
      return encode_t<DType::f32>(codes, src, n, inv, bits);
    case DType::bf16:
      return encode_t<DType::bf16>(codes, src, n, inv, bits);
    case DType::f16:
      return encode_t<DType::f16>(codes, src, n, inv, bits);
  }
}

void decode_scalar(void* dst, DType t, const uint8_t* codes, int64_t n, float scale, int bits) {
  switch (t) {
    case DType::f32:
      return decode_t<DType::f32>(dst, codes, n, scale, bits);
    case DType::bf16:
      return decode_t<DType::bf16>(dst, codes, n, scale, bits);
    case DType::f16:
      return decode_t<DType::f16>(dst, codes, n, scale, bits);
  }
}

void decode_add_scalar(float* acc, const uint8_t* codes, int64_t n, float scale, int bits) {
  for (int64_t i = 0; i < n; ++i) acc[i] += dequant_value(quant_code_at(codes, i, bits), scale);
}

}  // namespace

const QuantBodies kQuantBodiesScalar = {absmax_bits_scalar, encode_scalar, decode_scalar, decode_add_scalar};

}  // namespace detail

namespace {

// Below this many elements a call finishes faster than a thread team starts.
constexpr int64_t kParallelMin = int64_t{1} << 15;

const detail::QuantBodies& bodies_for(CpuIsa isa, const char* op) {
  if (isa == CpuIsa::best) isa = cpu_isa_detect();
  if (!cpu_isa_supported(isa)) {
    throw Unsupported(std::string(op) + ": this CPU does not support the " + std::string(cpu_isa_name(isa)) +
                      " path (best available: " + std::string(cpu_isa_name(cpu_isa_detect())) + ")");
  }
#if defined(__x86_64__)
  if (isa == CpuIsa::avx512) return detail::kQuantBodiesAvx512;
  if (isa == CpuIsa::avx2) return detail::kQuantBodiesAvx2;
#endif
  return detail::kQuantBodiesScalar;
}

// Where block b of a chunk lies: its first element and its length.
struct BlockRange {
  int64_t begin;
  int64_t len;
};

BlockRange block_range(int64_t chunk, int64_t block, int64_t b) {
  int64_t begin = b * block;
  return {begin, std::min(block, chunk - begin)};
}

}  // namespace

void quantize_cpu(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                  CpuIsa isa) {
  check_quant_args("quantize", f, chunk, chunks);
  const detail::QuantBodies& k = bodies_for(isa, "quantize");
  if (chunk == 0 || chunks == 0) return;
  const int64_t per_chunk = quant_blocks(chunk, f.block);
  const int64_t message = quant_message_bytes(chunk, f);
  const int64_t scales = quant_scales_offset(chunk, f.bits);
  const int64_t size = static_cast<int64_t>(dtype_size(src_type));
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const char*>(src);
#pragma omp parallel for schedule(static) if (chunk * chunks >= kParallelMin)
  for (int64_t w = 0; w < chunks * per_chunk; ++w) {
    const int64_t c = w / per_chunk;
    const int64_t b = w % per_chunk;
    const BlockRange r = block_range(chunk, f.block, b);
    const char* x = in + (c * chunk + r.begin) * size;
    uint8_t* m = out + c * message;
    const QuantScale q = quant_scale(k.absmax_bits(x, src_type, r.len), f.bits);
    std::memcpy(m + scales + 4 * b, &q.scale, 4);
    uint8_t* codes = m + quant_code_bytes(r.begin, f.bits);
    if (q.inv == 0.0f) {
      std::memset(codes, 0, static_cast<size_t>(quant_code_bytes(r.len, f.bits)));
    } else {
      k.encode(codes, x, src_type, r.len, q.inv, f.bits);
    }
  }
  const int64_t used = quant_code_bytes(chunk, f.bits);
  for (int64_t c = 0; c < chunks; ++c) std::memset(out + c * message + used, 0, static_cast<size_t>(scales - used));
}

void dequantize_cpu(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                    CpuIsa isa) {
  check_quant_args("dequantize", f, chunk, chunks);
  const detail::QuantBodies& k = bodies_for(isa, "dequantize");
  if (chunk == 0 || chunks == 0) return;
  const int64_t per_chunk = quant_blocks(chunk, f.block);
  const int64_t message = quant_message_bytes(chunk, f);
  const int64_t size = static_cast<int64_t>(dtype_size(dst_type));
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
#pragma omp parallel for schedule(static) if (chunk * chunks >= kParallelMin)
  for (int64_t w = 0; w < chunks * per_chunk; ++w) {
    const int64_t c = w / per_chunk;
    const int64_t b = w % per_chunk;
    const BlockRange r = block_range(chunk, f.block, b);
    const uint8_t* m = in + c * message;
    k.decode(out + (c * chunk + r.begin) * size, dst_type, m + quant_code_bytes(r.begin, f.bits), r.len,
             quant_scale_at(m, chunk, f.bits, b), f.bits);
  }
}

void dequantize_sum_cpu(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f, CpuIsa isa) {
  check_quant_args("dequantize_sum", f, chunk, chunks);
  const detail::QuantBodies& k = bodies_for(isa, "dequantize_sum");
  if (chunk == 0) return;
  const int64_t per_chunk = quant_blocks(chunk, f.block);
  const int64_t message = quant_message_bytes(chunk, f);
  const auto* in = static_cast<const uint8_t*>(src);
  // Block by block, so that the partial sums of a block stay in cache while every message is added.
#pragma omp parallel for schedule(static) if (chunk * std::max <int64_t>(chunks, 1) >= kParallelMin)
  for (int64_t b = 0; b < per_chunk; ++b) {
    const BlockRange r = block_range(chunk, f.block, b);
    float* acc = dst + r.begin;
    std::fill(acc, acc + r.len, 0.0f);
    for (int64_t c = 0; c < chunks; ++c) {
      const uint8_t* m = in + c * message;
      k.decode_add(acc, m + quant_code_bytes(r.begin, f.bits), r.len, quant_scale_at(m, chunk, f.bits, b), f.bits);
    }
  }
}

}  // namespace zero3

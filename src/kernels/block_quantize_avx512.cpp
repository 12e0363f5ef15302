// AVX-512 bodies of the CPU block quantization (16 lanes), each function under the target attribute of
// kernels/simd_avx512.hpp. The lanes perform the operations of the scalar element functions
// (kernels/block_quantize.hpp) one for one: the same product, round to nearest even, clamp, and for
// decoding one product (and one add), so the bits are the reference's. Tails run the scalar bodies.
#if defined(__x86_64__)

#include <cstdint>
#include <cstring>

#include "kernels/block_quantize_bodies.hpp"
#include "kernels/simd_avx512.hpp"

namespace zero3::detail {
namespace {

using namespace avx512;

template <DType T>
ZERO3_AVX512 inline __m512 load16(const void* src, int64_t i) {
  if constexpr (T == DType::f32) return _mm512_loadu_ps(static_cast<const float*>(src) + i);
  if constexpr (T == DType::bf16) return load_bf16(static_cast<const uint16_t*>(src) + i);
  if constexpr (T == DType::f16) return load_f16(static_cast<const uint16_t*>(src) + i);
}

const void* advance(const void* p, DType t, int64_t i) {
  return static_cast<const char*>(p) + i * static_cast<int64_t>(dtype_size(t));
}

template <DType T>
ZERO3_AVX512 uint32_t absmax_bits_t(const void* src, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i m = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(load16<T>(src, i)), abs_mask));
  }
  uint32_t r = _mm512_reduce_max_epu32(m);
  if (i < n) {
    uint32_t tail = kQuantBodiesScalar.absmax_bits(advance(src, T, i), T, n - i);
    r = tail > r ? tail : r;
  }
  return r;
}

// 16 codes as int32 lanes: rne(x * inv) clamped to [-qmax, qmax] (the value is integral, so the conversion
// is exact).
ZERO3_AVX512 inline __m512i codes16(__m512 x, __m512 inv, __m512 qmax) {
  __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm512_max_ps(_mm512_min_ps(r, qmax), _mm512_sub_ps(_mm512_setzero_ps(), qmax));
  return _mm512_cvtps_epi32(r);
}

// 32 int8 codes (bytes c0..c31) to 16 int4 bytes: (c[2j] << 4) | (c[2j+1] & 0xf), from each 16-bit lane.
ZERO3_AVX512 inline __m128i pack_int4(__m256i bytes) {
  __m256i even = _mm256_and_si256(_mm256_slli_epi16(bytes, 4), _mm256_set1_epi16(0x00f0));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi16(bytes, 8), _mm256_set1_epi16(0x000f));
  return _mm256_cvtepi16_epi8(_mm256_or_si256(even, odd));
}

template <DType T>
ZERO3_AVX512 void encode_t(uint8_t* codes, const void* src, int64_t n, float inv, int bits) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 vq = _mm512_set1_ps(bits == 4 ? 7.0f : 127.0f);
  int64_t i = 0;
  if (bits == 8) {
    for (; i + 16 <= n; i += 16) {
      __m128i b = _mm512_cvtepi32_epi8(codes16(load16<T>(src, i), vinv, vq));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), b);
    }
    if (i < n) kQuantBodiesScalar.encode(codes + i, advance(src, T, i), T, n - i, inv, bits);
    return;
  }
  for (; i + 32 <= n; i += 32) {
    __m128i lo = _mm512_cvtepi32_epi8(codes16(load16<T>(src, i), vinv, vq));
    __m128i hi = _mm512_cvtepi32_epi8(codes16(load16<T>(src, i + 16), vinv, vq));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / 2), pack_int4(_mm256_set_m128i(hi, lo)));
  }
  if (i < n) kQuantBodiesScalar.encode(codes + i / 2, advance(src, T, i), T, n - i, inv, bits);
}

// 16 codes as fp32 lanes, from codes + i (int8) or codes + i/2 (int4, i even).
ZERO3_AVX512 inline __m512 load_codes16(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  // Each of the 8 bytes in two lanes (b0 b0 b1 b1 ...); shifting lane 2j's high nibble and lane 2j+1's low
  // nibble to the top and back sign-extends it.
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
  __m512i twice = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
  const __m512i shift = _mm512_set_epi32(28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24);
  return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(twice, shift), 28));
}

template <DType T>
ZERO3_AVX512 void decode_t(void* dst, const uint8_t* codes, int64_t n, float scale, int bits) {
  const __m512 vs = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 y = _mm512_mul_ps(load_codes16(codes, i, bits), vs);
    if constexpr (T == DType::f32) _mm512_storeu_ps(static_cast<float*>(dst) + i, y);
    if constexpr (T == DType::bf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + i), to_bf16(y));
    }
    if constexpr (T == DType::f16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + i), to_f16(y));
    }
  }
  if (i < n) {
    void* out = static_cast<char*>(dst) + i * static_cast<int64_t>(dtype_size(T));
    kQuantBodiesScalar.decode(out, T, codes + (bits == 8 ? i : i / 2), n - i, scale, bits);
  }
}

ZERO3_AVX512 uint32_t absmax_bits(const void* src, DType t, int64_t n) {
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

ZERO3_AVX512 void encode(uint8_t* codes, const void* src, DType t, int64_t n, float inv, int bits) {
  switch (t) {
    case DType::f32:
      return encode_t<DType::f32>(codes, src, n, inv, bits);
    case DType::bf16:
      return encode_t<DType::bf16>(codes, src, n, inv, bits);
    case DType::f16:
      return encode_t<DType::f16>(codes, src, n, inv, bits);
  }
}

ZERO3_AVX512 void decode(void* dst, DType t, const uint8_t* codes, int64_t n, float scale, int bits) {
  switch (t) {
    case DType::f32:
      return decode_t<DType::f32>(dst, codes, n, scale, bits);
    case DType::bf16:
      return decode_t<DType::bf16>(dst, codes, n, scale, bits);
    case DType::f16:
      return decode_t<DType::f16>(dst, codes, n, scale, bits);
  }
}

ZERO3_AVX512 void decode_add(float* acc, const uint8_t* codes, int64_t n, float scale, int bits) {
  const __m512 vs = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 y = _mm512_mul_ps(load_codes16(codes, i, bits), vs);
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), y));
  }
  if (i < n) kQuantBodiesScalar.decode_add(acc + i, codes + (bits == 8 ? i : i / 2), n - i, scale, bits);
}

}  // namespace

const QuantBodies kQuantBodiesAvx512 = {absmax_bits, encode, decode, decode_add};

}  // namespace zero3::detail

#endif  // __x86_64__

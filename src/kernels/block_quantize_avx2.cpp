// AVX2 bodies of the CPU block quantization (8 lanes), for x86-64 CPUs without AVX-512. Same rules as the
// AVX-512 file: a target attribute per function, the scalar element functions' operations one for one,
// scalar tails.
#if defined(__x86_64__)

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/block_quantize_bodies.hpp"
#include "kernels/simd_avx2.hpp"

namespace zero3::detail {
namespace {

using namespace avx2;

template <DType T>
ZERO3_AVX2 inline __m256 load8(const void* src, int64_t i) {
  if constexpr (T == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(src) + i);
  if constexpr (T == DType::bf16) return load_bf16(static_cast<const uint16_t*>(src) + i);
  if constexpr (T == DType::f16) return load_f16(static_cast<const uint16_t*>(src) + i);
}

const void* advance(const void* p, DType t, int64_t i) {
  return static_cast<const char*>(p) + i * static_cast<int64_t>(dtype_size(t));
}

template <DType T>
ZERO3_AVX2 uint32_t absmax_bits_t(const void* src, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(load8<T>(src, i)), abs_mask));
  }
  uint32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), m);
  uint32_t r = *std::max_element(lanes, lanes + 8);
  if (i < n) r = std::max(r, kQuantBodiesScalar.absmax_bits(advance(src, T, i), T, n - i));
  return r;
}

// 8 codes as int8 in the low 8 bytes: rne(x * inv) clamped to [-qmax, qmax], then narrowed (exactly).
ZERO3_AVX2 inline __m128i codes8(__m256 x, __m256 inv, __m256 qmax) {
  __m256 r = _mm256_round_ps(_mm256_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_max_ps(_mm256_min_ps(r, qmax), _mm256_sub_ps(_mm256_setzero_ps(), qmax));
  __m256i v = _mm256_cvtps_epi32(r);
  __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_packs_epi16(v16, v16);
}

// 8 int8 codes (low bytes c0..c7) to 4 int4 bytes (low 32 bits): (c[2j] << 4) | (c[2j+1] & 0xf).
ZERO3_AVX2 inline uint32_t pack_int4(__m128i bytes) {
  __m128i even = _mm_and_si128(_mm_slli_epi16(bytes, 4), _mm_set1_epi16(0x00f0));
  __m128i odd = _mm_and_si128(_mm_srli_epi16(bytes, 8), _mm_set1_epi16(0x000f));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(_mm_or_si128(even, odd), _mm_setzero_si128())));
}

template <DType T>
ZERO3_AVX2 void encode_t(uint8_t* codes, const void* src, int64_t n, float inv, int bits) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 vq = _mm256_set1_ps(bits == 4 ? 7.0f : 127.0f);
  int64_t i = 0;
  if (bits == 8) {
    for (; i + 8 <= n; i += 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), codes8(load8<T>(src, i), vinv, vq));
    }
    if (i < n) kQuantBodiesScalar.encode(codes + i, advance(src, T, i), T, n - i, inv, bits);
    return;
  }
  for (; i + 8 <= n; i += 8) {
    uint32_t packed = pack_int4(codes8(load8<T>(src, i), vinv, vq));
    std::memcpy(codes + i / 2, &packed, 4);
  }
  if (i < n) kQuantBodiesScalar.encode(codes + i / 2, advance(src, T, i), T, n - i, inv, bits);
}

// 8 codes as fp32 lanes, from codes + i (int8) or codes + i/2 (int4, i even).
ZERO3_AVX2 inline __m256 load_codes8(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  int32_t four;
  std::memcpy(&four, codes + i / 2, 4);
  // One byte per 16-bit lane; shifting the nibble to the top and back sign-extends it.
  __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(four));
  __m128i even = _mm_srai_epi16(_mm_slli_epi16(w, 8), 12);
  __m128i odd = _mm_srai_epi16(_mm_slli_epi16(w, 12), 12);
  return _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_unpacklo_epi16(even, odd)));
}

template <DType T>
ZERO3_AVX2 void decode_t(void* dst, const uint8_t* codes, int64_t n, float scale, int bits) {
  const __m256 vs = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = _mm256_mul_ps(load_codes8(codes, i, bits), vs);
    if constexpr (T == DType::f32) _mm256_storeu_ps(static_cast<float*>(dst) + i, y);
    if constexpr (T == DType::bf16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(dst) + i), to_bf16(y));
    }
    if constexpr (T == DType::f16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(dst) + i), to_f16(y));
    }
  }
  if (i < n) {
    void* out = static_cast<char*>(dst) + i * static_cast<int64_t>(dtype_size(T));
    kQuantBodiesScalar.decode(out, T, codes + (bits == 8 ? i : i / 2), n - i, scale, bits);
  }
}

ZERO3_AVX2 uint32_t absmax_bits(const void* src, DType t, int64_t n) {
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

ZERO3_AVX2 void encode(uint8_t* codes, const void* src, DType t, int64_t n, float inv, int bits) {
  switch (t) {
    case DType::f32:
      return encode_t<DType::f32>(codes, src, n, inv, bits);
    case DType::bf16:
      return encode_t<DType::bf16>(codes, src, n, inv, bits);
    case DType::f16:
      return encode_t<DType::f16>(codes, src, n, inv, bits);
  }
}

ZERO3_AVX2 void decode(void* dst, DType t, const uint8_t* codes, int64_t n, float scale, int bits) {
  switch (t) {
    case DType::f32:
      return decode_t<DType::f32>(dst, codes, n, scale, bits);
    case DType::bf16:
      return decode_t<DType::bf16>(dst, codes, n, scale, bits);
    case DType::f16:
      return decode_t<DType::f16>(dst, codes, n, scale, bits);
  }
}

ZERO3_AVX2 void decode_add(float* acc, const uint8_t* codes, int64_t n, float scale, int bits) {
  const __m256 vs = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 y = _mm256_mul_ps(load_codes8(codes, i, bits), vs);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), y));
  }
  if (i < n) kQuantBodiesScalar.decode_add(acc + i, codes + (bits == 8 ? i : i / 2), n - i, scale, bits);
}

}  // namespace

const QuantBodies kQuantBodiesAvx2 = {absmax_bits, encode, decode, decode_add};

}  // namespace zero3::detail

#endif  // __x86_64__

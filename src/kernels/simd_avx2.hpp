// AVX2 (8-lane) counterpart of simd_avx512.hpp, for x86-64 CPUs without AVX-512: the element-type
// conversions with the bits of dtype.hpp, each function under a target attribute (see simd_avx512.hpp).
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

// No fma contraction, as in simd_avx512.hpp.
#define ZERO3_AVX2 __attribute__((target("avx2,f16c"), optimize("fp-contract=off")))

namespace zero3::detail::avx2 {

// Narrows 8 lanes holding values in [0, 0xffff] to 8 uint16 (unsigned saturation is then exact).
ZERO3_AVX2 inline __m128i narrow_u16(__m256i x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

ZERO3_AVX2 inline __m256i nan_mask(__m256i u) {
  __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  return _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
}

// f32_to_bf16 on 8 lanes.
ZERO3_AVX2 inline __m128i to_bf16(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, qnan, nan_mask(u));
  return narrow_u16(r);
}

// f32_to_f16 on 8 lanes: F16C rounds to nearest even; NaNs are rewritten to the reference's sign|0x7e00.
ZERO3_AVX2 inline __m128i to_f16(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i u = _mm256_castps_si256(x);
  __m256i nan = nan_mask(u);
  if (_mm256_testz_si256(nan, nan)) return h;
  __m256i qnan =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7e00));
  // Signed saturation keeps an all-ones 32-bit mask all-ones in 16 bits.
  __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  return _mm_blendv_epi8(h, narrow_u16(qnan), nan16);
}

// 8 bf16 values as fp32 (exact).
ZERO3_AVX2 inline __m256 load_bf16(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// 8 f16 values as fp32: the values of f16_to_f32, NaN payloads aside (F16C quiets them).
ZERO3_AVX2 inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace zero3::detail::avx2

#endif  // __x86_64__

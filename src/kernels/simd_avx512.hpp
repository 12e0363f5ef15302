// AVX-512 lanes to and from the element types, with the bits of the dtype.hpp conversions: shared by the
// CPU kernels' vector bodies (CPU Adam, block quantization).
//
// Every function carries ZERO3_AVX512, a target attribute, rather than the including file being compiled
// with -mavx512f: then no inline function from a shared header (dtype.hpp, ...) gets an AVX-512 copy that
// the linker could pick for a CPU without it. Callers check the CPU first (cpu_isa_supported).
#pragma once

#if defined(__x86_64__)

// GCC 12 reports the deliberately undefined pass-through operands inside its own intrinsics
// (_mm512_undefined_*) as maybe-uninitialized once they are inlined; the values are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

// GCC contracts a*b+c into an fma by default in C++ (-ffp-contract=fast), and the intrinsics are plain vector
// arithmetic to it; fp-contract=off keeps the separate roundings of the scalar reference.
#define ZERO3_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c"), optimize("fp-contract=off")))

namespace zero3::detail::avx512 {

// f32_to_bf16 on 16 lanes: add 0x7fff plus the lowest kept bit, keep the high half; NaN -> quiet NaN.
ZERO3_AVX512 inline __m256i to_bf16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// f32_to_f16 on 16 lanes: the hardware conversion rounds to nearest even (subnormals and overflow to Inf
// included); only NaNs differ from the reference, which makes every NaN sign|0x7e00.
ZERO3_AVX512 inline __m256i to_f16(__m512 x) {
  __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i u = _mm512_castps_si512(x);
  __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  if (nan == 0) return h;
  __m512i qnan =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7e00));
  return _mm256_mask_blend_epi16(nan, h, _mm512_cvtepi32_epi16(qnan));
}

// 16 bf16 values as fp32 (exact: bf16 is the high half of an fp32).
ZERO3_AVX512 inline __m512 load_bf16(const uint16_t* p) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// 16 f16 values as fp32: the values of f16_to_f32 (exact), NaN payloads aside (the hardware quiets them).
ZERO3_AVX512 inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

}  // namespace zero3::detail::avx512

#endif  // __x86_64__

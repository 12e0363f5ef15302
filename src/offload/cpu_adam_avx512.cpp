// AVX-512 body of cpu_adam_step, each function under the target attribute of kernels/simd_avx512.hpp. The
// arithmetic mirrors adam_update statement by statement (mul and add, never fma) so the results are the
// scalar bits.
#if defined(__x86_64__)

#include <cstdint>

#include "kernels/simd_avx512.hpp"
#include "offload/cpu_adam_kernels.hpp"

namespace zero3::detail {
namespace {

using avx512::to_bf16;
using avx512::to_f16;

enum class Copy { none, f32, bf16, f16 };

struct Consts512 {
  __m512 l2, b1, omb1, b2, omb2, inv_sqrt_bc2, eps, decay, step;
};

ZERO3_AVX512 inline __m512 update16(__m512 p, __m512 g, __m512& m, __m512& v, const Consts512& k) {
  __m512 gp = _mm512_mul_ps(k.l2, p);
  g = _mm512_add_ps(g, gp);
  __m512 mb = _mm512_mul_ps(k.b1, m);
  __m512 ga = _mm512_mul_ps(k.omb1, g);
  m = _mm512_add_ps(mb, ga);
  __m512 vb = _mm512_mul_ps(k.b2, v);
  __m512 gg = _mm512_mul_ps(g, g);
  __m512 gb = _mm512_mul_ps(k.omb2, gg);
  v = _mm512_add_ps(vb, gb);
  __m512 s = _mm512_sqrt_ps(v);
  __m512 sc = _mm512_mul_ps(s, k.inv_sqrt_bc2);
  __m512 denom = _mm512_add_ps(sc, k.eps);
  __m512 pd = _mm512_mul_ps(p, k.decay);
  __m512 upd = _mm512_div_ps(m, denom);
  __m512 delta = _mm512_mul_ps(k.step, upd);
  return _mm512_add_ps(pd, delta);
}

template <Copy kCopy>
ZERO3_AVX512 void run(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out) {
  const Consts512 k{_mm512_set1_ps(c.l2_decay), _mm512_set1_ps(c.beta1),           _mm512_set1_ps(c.one_minus_beta1),
                    _mm512_set1_ps(c.beta2),    _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.inv_sqrt_bc2),
                    _mm512_set1_ps(c.eps),      _mm512_set1_ps(c.decoupled_decay), _mm512_set1_ps(c.step_size)};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 vp = _mm512_loadu_ps(p + i);
    __m512 vg = _mm512_loadu_ps(g + i);
    __m512 vm = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    vp = update16(vp, vg, vm, vv, k);
    _mm512_storeu_ps(p + i, vp);
    _mm512_storeu_ps(m + i, vm);
    _mm512_storeu_ps(v + i, vv);
    if constexpr (kCopy == Copy::f32) _mm512_storeu_ps(static_cast<float*>(copy_out) + i, vp);
    if constexpr (kCopy == Copy::bf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(copy_out) + i), to_bf16(vp));
    }
    if constexpr (kCopy == Copy::f16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(copy_out) + i), to_f16(vp));
    }
  }
  // The tail runs the scalar path itself (another translation unit, compiled for the baseline ISA), so it
  // cannot pick up a contraction here.
  if (i < n) {
    DType dt = kCopy == Copy::bf16 ? DType::bf16 : kCopy == Copy::f16 ? DType::f16 : DType::f32;
    size_t width = kCopy == Copy::f32 ? 4 : 2;
    void* out = kCopy == Copy::none ? nullptr : static_cast<char*>(copy_out) + i * width;
    adam_chunk_scalar(p + i, g + i, m + i, v + i, n - i, c, out, dt);
  }
}

}  // namespace

ZERO3_AVX512 void adam_chunk_avx512(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c,
                                    void* copy_out, DType copy_dtype) {
  if (copy_out == nullptr) return run<Copy::none>(p, g, m, v, n, c, nullptr);
  switch (copy_dtype) {
    case DType::f32:
      return run<Copy::f32>(p, g, m, v, n, c, copy_out);
    case DType::bf16:
      return run<Copy::bf16>(p, g, m, v, n, c, copy_out);
    case DType::f16:
      return run<Copy::f16>(p, g, m, v, n, c, copy_out);
  }
}

}  // namespace zero3::detail

#endif  // __x86_64__

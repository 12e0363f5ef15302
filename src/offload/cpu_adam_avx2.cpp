// AVX2 body of cpu_adam_step (8 lanes), for x86-64 CPUs without AVX-512. Same rules as the AVX-512 file:
// a target attribute per function, the adam_update operations in order, no fma.
#if defined(__x86_64__)

#include <cstdint>

#include "kernels/simd_avx2.hpp"
#include "offload/cpu_adam_kernels.hpp"

namespace zero3::detail {
namespace {

using avx2::to_bf16;
using avx2::to_f16;

enum class Copy { none, f32, bf16, f16 };

struct Consts256 {
  __m256 l2, b1, omb1, b2, omb2, inv_sqrt_bc2, eps, decay, step;
};

ZERO3_AVX2 inline __m256 update8(__m256 p, __m256 g, __m256& m, __m256& v, const Consts256& k) {
  __m256 gp = _mm256_mul_ps(k.l2, p);
  g = _mm256_add_ps(g, gp);
  __m256 mb = _mm256_mul_ps(k.b1, m);
  __m256 ga = _mm256_mul_ps(k.omb1, g);
  m = _mm256_add_ps(mb, ga);
  __m256 vb = _mm256_mul_ps(k.b2, v);
  __m256 gg = _mm256_mul_ps(g, g);
  __m256 gb = _mm256_mul_ps(k.omb2, gg);
  v = _mm256_add_ps(vb, gb);
  __m256 s = _mm256_sqrt_ps(v);
  __m256 sc = _mm256_mul_ps(s, k.inv_sqrt_bc2);
  __m256 denom = _mm256_add_ps(sc, k.eps);
  __m256 pd = _mm256_mul_ps(p, k.decay);
  __m256 upd = _mm256_div_ps(m, denom);
  __m256 delta = _mm256_mul_ps(k.step, upd);
  return _mm256_add_ps(pd, delta);
}

template <Copy kCopy>
ZERO3_AVX2 void run(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c, void* copy_out) {
  const Consts256 k{_mm256_set1_ps(c.l2_decay), _mm256_set1_ps(c.beta1),           _mm256_set1_ps(c.one_minus_beta1),
                    _mm256_set1_ps(c.beta2),    _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.inv_sqrt_bc2),
                    _mm256_set1_ps(c.eps),      _mm256_set1_ps(c.decoupled_decay), _mm256_set1_ps(c.step_size)};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 vp = _mm256_loadu_ps(p + i);
    __m256 vg = _mm256_loadu_ps(g + i);
    __m256 vm = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    vp = update8(vp, vg, vm, vv, k);
    _mm256_storeu_ps(p + i, vp);
    _mm256_storeu_ps(m + i, vm);
    _mm256_storeu_ps(v + i, vv);
    if constexpr (kCopy == Copy::f32) _mm256_storeu_ps(static_cast<float*>(copy_out) + i, vp);
    if constexpr (kCopy == Copy::bf16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(copy_out) + i), to_bf16(vp));
    }
    if constexpr (kCopy == Copy::f16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(copy_out) + i), to_f16(vp));
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

ZERO3_AVX2 void adam_chunk_avx2(float* p, const float* g, float* m, float* v, size_t n, const AdamStepConsts& c,
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

// The fused Adam/AdamW step: adam_update per element, with the compute-dtype copy of the updated weight
// written in the same pass (one read of p, g, m, v; one write of p, m, v and the copy).
#include "core/check.hpp"
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/launch_config.cuh"
#include "kernels/elementwise.hpp"

namespace zero3::detail::cuda {
namespace {

template <bool kCopy, DType C>
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, AdamStepConsts c, void* __restrict__ copy_out) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float pi = p[i], mi = m[i], vi = v[i];
    adam_update(pi, g[i], mi, vi, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kCopy) store_from_f32<C>(copy_out, i, pi);
  }
}

}  // namespace

void launch_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
                 DType copy_type, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned int blocks = blocks_for(n);
  if (copy_out == nullptr) {
    adam_kernel<false, DType::f32><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, nullptr);
  } else {
    switch (copy_type) {
      case DType::f32:
        adam_kernel<true, DType::f32><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, copy_out);
        break;
      case DType::bf16:
        adam_kernel<true, DType::bf16><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, copy_out);
        break;
      case DType::f16:
        adam_kernel<true, DType::f16><<<blocks, kThreads, 0, stream>>>(p, g, m, v, n, c, copy_out);
        break;
    }
  }
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero3::detail::cuda

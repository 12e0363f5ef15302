// Scaled, converting copies and accumulation: the cpu backend's scale_copy/scale_add loops as kernels.
#include "core/check.hpp"
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/launch_config.cuh"
#include "kernels/elementwise.hpp"

namespace zero3::detail::cuda {
namespace {

template <DType D, DType S>
__global__ void scale_copy_kernel(void* dst, const void* src, float scale, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) scale_copy_element<D, S>(dst, src, scale, i);
}

template <DType D, DType S>
__global__ void scale_add_kernel(void* dst, const void* src, float scale, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) scale_add_element<D, S>(dst, src, scale, i);
}

template <DType D, DType S>
void launch_pair(bool add, void* dst, const void* src, float scale, int64_t n, cudaStream_t stream) {
  if (add) {
    scale_add_kernel<D, S><<<blocks_for(n), kThreads, 0, stream>>>(dst, src, scale, n);
  } else {
    scale_copy_kernel<D, S><<<blocks_for(n), kThreads, 0, stream>>>(dst, src, scale, n);
  }
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

template <DType D>
void launch_with_dst(bool add, void* dst, const void* src, DType src_type, float scale, int64_t n,
                     cudaStream_t stream) {
  switch (src_type) {
    case DType::f32:
      return launch_pair<D, DType::f32>(add, dst, src, scale, n, stream);
    case DType::bf16:
      return launch_pair<D, DType::bf16>(add, dst, src, scale, n, stream);
    case DType::f16:
      return launch_pair<D, DType::f16>(add, dst, src, scale, n, stream);
  }
}

void launch(bool add, void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
            cudaStream_t stream) {
  if (n <= 0) return;
  switch (dst_type) {
    case DType::f32:
      return launch_with_dst<DType::f32>(add, dst, src, src_type, scale, n, stream);
    case DType::bf16:
      return launch_with_dst<DType::bf16>(add, dst, src, src_type, scale, n, stream);
    case DType::f16:
      return launch_with_dst<DType::f16>(add, dst, src, src_type, scale, n, stream);
  }
}

}  // namespace

void launch_scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                       cudaStream_t stream) {
  launch(false, dst, dst_type, src, src_type, scale, n, stream);
}

void launch_scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                      cudaStream_t stream) {
  launch(true, dst, dst_type, src, src_type, scale, n, stream);
}

cudaError_t kernel_image_status() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, scale_copy_kernel<DType::f32, DType::f32>);
}

}  // namespace zero3::detail::cuda

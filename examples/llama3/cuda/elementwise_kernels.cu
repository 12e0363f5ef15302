// Element-wise add and type conversion on the device (cuda_ops.hpp): grid-stride loops, arithmetic in float,
// one round-to-nearest-even store per element. A conversion between equal types is a device-to-device copy.
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"

namespace llama3::cuda {
namespace {

using namespace kernels;

// y may alias a or b: each element is read and then written by the same thread.
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(y, i, load(a, i) + load(b, i));
}

template <typename D, typename S>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(dst, i, load(src, i));
}

}  // namespace

void add(const void* a, const void* b, void* y, int64_t n, DType act, cudaStream_t stream) {
  detail::check_non_negative(n, "add", "n");
  detail::check_act(act, "add");
  if (n == 0) return;
  dispatch_act(act, "add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<T><<<element_blocks(n), kElementThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                     static_cast<T*>(y), n);
    LLAMA3_CUDA_CHECK_LAUNCH("add_kernel");
  });
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t stream) {
  detail::check_non_negative(n, "convert", "n");
  if (n == 0) return;
  if (src_type == dst_type) {
    LLAMA3_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * zero3::dtype_size(src_type),
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch_act(src_type, "convert (source)", [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_act(dst_type, "convert (destination)", [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      convert_kernel<D, S>
          <<<element_blocks(n), kElementThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      LLAMA3_CUDA_CHECK_LAUNCH("convert_kernel");
    });
  });
}

}  // namespace llama3::cuda

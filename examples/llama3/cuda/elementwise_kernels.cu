// Element-wise add and type conversion on the device (cuda_ops.hpp): grid-stride loops, arithmetic in float,
// one round-to-nearest-even store per element; the add in 16-byte packs when its pointers are aligned. A conversion
// between equal types is a device-to-device copy.
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"

namespace llama3::cuda {
namespace {

using namespace kernels;

// y may alias a or b: each element is read and then written by the same thread. V elements per iteration (a
// 16-byte pack, or 1); the n % V elements past the last pack one by one.
template <typename T, int V>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  const int64_t packs = n / V;
  for (int64_t g = global_thread(); g < packs; g += grid_threads()) {
    float u[V], v[V];
    load_pack<T, V>(a + g * V, u);
    load_pack<T, V>(b + g * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] += v[k];
    store_pack<T, V>(y + g * V, u);
  }
  for (int64_t i = packs * V + global_thread(); i < n; i += grid_threads()) store(y, i, load(a, i) + load(b, i));
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
    dispatch_width<T>(aligned16({a, b, y}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      add_kernel<T, V><<<element_blocks((n + V - 1) / V), kElementThreads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n);
      LLAMA3_CUDA_CHECK_LAUNCH("add_kernel");
    });
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

// Launch geometry shared by the element kernels: one thread per element, in a grid-stride loop so any n
// fits a legal grid.
#pragma once

#include <cstdint>

namespace zero3::detail::cuda {

inline constexpr int kThreads = 256;
// Past this many blocks each thread takes several elements; CUDA allows 2^31 - 1.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 21;

inline unsigned int blocks_for(int64_t work, int threads = kThreads) {
  int64_t blocks = (work + threads - 1) / threads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace zero3::detail::cuda

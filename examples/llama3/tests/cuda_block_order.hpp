// The order in which the example's CUDA kernels combine a row, on the host: a block of `threads` threads takes the
// elements thread-strided (thread t: groups t, t + threads, ... of `width` consecutive elements, the 16-byte pack
// or 1), each thread keeps its own partial, and the block combines the partials as cuda/kernel_support.cuh's
// block_reduce does (within each warp of 32 an xor butterfly, then the warps' results in warp order through the
// same butterfly). The kernel_math tests run the shared arithmetic in this order to compare it with the CPU ops,
// which add a row in element order. (Under nvcc a product added to a sum may also be contracted into one fused
// multiply-add; the tests' tolerances cover that.)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "zero3/dtype.hpp"

namespace llama3::testing {

inline constexpr int kWarp = 32;

// One warp's xor butterfly over 32 lanes (as warp_reduce); every lane ends with the same value, lane 0's returned.
template <typename T, typename Combine>
T warp_butterfly(std::vector<T> lanes, Combine combine) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    std::vector<T> next(lanes.size());
    for (int l = 0; l < kWarp; ++l) next[l] = combine(lanes[l], lanes[l ^ offset]);
    lanes = next;
  }
  return lanes[0];
}

// block_reduce of one value per thread (threads a multiple of 32, at most 1024); `identity` fills the lanes of
// warp 0 beyond the number of warps (0 for a sum, -inf for a max).
template <typename T, typename Combine>
T block_reduce(const std::vector<T>& per_thread, T identity, Combine combine) {
  const int threads = static_cast<int>(per_thread.size()), warps = threads / kWarp;
  std::vector<T> warp_results(kWarp, identity);
  for (int w = 0; w < warps; ++w) {
    std::vector<T> lanes(per_thread.begin() + w * kWarp, per_thread.begin() + (w + 1) * kWarp);
    warp_results[w] = warp_butterfly(lanes, combine);
  }
  return warp_butterfly(warp_results, combine);
}

template <typename T>
T block_sum(const std::vector<T>& per_thread) {
  return block_reduce(per_thread, T(0), [](T a, T b) { return a + b; });
}

inline float block_max(const std::vector<float>& per_thread) {
  return block_reduce(per_thread, -INFINITY, [](float a, float b) { return std::fmax(a, b); });
}

// For each thread t of `threads`, f(t, first) over the groups of `width` elements it takes in a row of n
// (first = the group's first element); n must be a multiple of width.
template <typename F>
void for_thread_groups(int threads, int64_t n, int64_t width, F f) {
  for (int t = 0; t < threads; ++t)
    for (int64_t g = t; g < n / width; g += threads) f(t, g * width);
}

// bf16 as the kernels store it (round to nearest even) and read it back.
inline float round_bf16(float x) { return zero3::bf16_to_f32(zero3::f32_to_bf16(x)); }

}  // namespace llama3::testing

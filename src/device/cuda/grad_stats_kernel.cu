// Sum of squares and Inf/NaN count, with the cpu backend's exact order of additions.
//
// The cpu loop gives each chunk of kGradStatsChunk elements to one thread, which adds double(x)^2 one
// element after the other; the host then adds the chunk sums in chunk order. Here lane j of a warp owns
// chunk (32*w + j) and adds its elements in the same order, so every chunk sum is the same bits (each
// square of a float is exact in double; only the order of the additions could differ, and it does not).
// The host adds the chunk sums in order, as on cpu (or, for the stream-ordered statistics, one device thread does,
// in the same order).
//
// Reading chunk j's elements one by one from lane j would touch 32 cache lines 64 KiB apart per step. The
// warp instead stages a 32x32 tile in shared memory: row r holds 32 consecutive elements of chunk r, read
// by the 32 lanes as one coalesced 128-byte access (64 bytes for 16-bit types); lane j then sums row j. The
// next tile is loaded into registers while the current one is summed.
#include "core/check.hpp"
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/launch_config.cuh"
#include "kernels/elementwise.hpp"

namespace zero3::detail::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
static_assert(kGradStatsChunk % kWarp == 0, "a chunk is a whole number of tile columns");

template <DType T>
__device__ __forceinline__ void load_tile_column(const void* x, int64_t n, int64_t first_chunk, int64_t chunks,
                                                 int64_t offset, int lane, float (&column)[kWarp]) {
#pragma unroll
  for (int r = 0; r < kWarp; ++r) {
    const int64_t chunk = first_chunk + r;
    const int64_t index = chunk * kGradStatsChunk + offset + lane;
    column[r] = (chunk < chunks && index < n) ? load_as_f32<T>(x, index) : 0.0f;
  }
}

template <DType T>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    grad_stats_kernel(const void* x, int64_t n, int64_t chunks, double* chunk_sums, unsigned long long* non_finite) {
  __shared__ float tile[kWarpsPerBlock][kWarp][kWarp + 1];  // +1: row reads by lane hit distinct banks
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t first_chunk = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kWarp;
  if (first_chunk >= chunks) return;  // the whole warp leaves together
  const int64_t my_chunk = first_chunk + lane;
  const int64_t my_begin = my_chunk * kGradStatsChunk;
  // Elements of my chunk that exist (0 for a lane past the last chunk).
  int64_t my_count = my_chunk < chunks ? n - my_begin : 0;
  if (my_count > kGradStatsChunk) my_count = kGradStatsChunk;
  // Columns any row of this warp still needs: the first chunk is always the fullest.
  int64_t warp_count = n - first_chunk * kGradStatsChunk;
  if (warp_count > kGradStatsChunk) warp_count = kGradStatsChunk;

  float next[kWarp];
  load_tile_column<T>(x, n, first_chunk, chunks, 0, lane, next);
  double sum = 0.0;
  unsigned long long bad = 0;
  for (int64_t offset = 0; offset < warp_count; offset += kWarp) {
#pragma unroll
    for (int r = 0; r < kWarp; ++r) tile[warp][r][lane] = next[r];
    __syncwarp();
    if (offset + kWarp < warp_count) load_tile_column<T>(x, n, first_chunk, chunks, offset + kWarp, lane, next);
    const int64_t valid = my_count - offset;  // elements of my row that exist in this tile
#pragma unroll 8
    for (int k = 0; k < kWarp; ++k) {
      if (k < valid) {
        const float v = tile[warp][lane][k];
        bad += non_finite_f32(v) ? 1u : 0u;
        const double d = static_cast<double>(v);
        sum += d * d;
      }
    }
    __syncwarp();
  }
  if (my_chunk < chunks) chunk_sums[my_chunk] = sum;
  for (int delta = kWarp / 2; delta > 0; delta /= 2) bad += __shfl_down_sync(0xffffffffu, bad, delta);
  if (lane == 0 && bad != 0) atomicAdd(non_finite, bad);
}

template <DType T>
void launch_typed(const void* x, int64_t n, double* chunk_sums, unsigned long long* non_finite, cudaStream_t stream) {
  const int64_t chunks = grad_stats_chunks(n);
  const int64_t chunks_per_block = int64_t{kWarp} * kWarpsPerBlock;
  const int64_t blocks = (chunks + chunks_per_block - 1) / chunks_per_block;
  grad_stats_kernel<T>
      <<<static_cast<unsigned int>(blocks), kWarp * kWarpsPerBlock, 0, stream>>>(x, n, chunks, chunk_sums, non_finite);
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

__global__ void add_grad_stats_kernel(const double* chunk_sums, int64_t chunks, const unsigned long long* non_finite,
                                      double* acc) {
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += chunk_sums[c];
  acc[0] += sum;
  acc[1] += static_cast<double>(*non_finite);
}

__global__ void grad_stats_f32_kernel(const double* acc, float* out) { grad_stats_f32(acc, out); }

}  // namespace

void launch_add_grad_stats(const double* chunk_sums, int64_t chunks, const unsigned long long* non_finite, double* acc,
                           cudaStream_t stream) {
  add_grad_stats_kernel<<<1, 1, 0, stream>>>(chunk_sums, chunks, non_finite, acc);
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

void launch_grad_stats_f32(const double* acc, float* out, cudaStream_t stream) {
  grad_stats_f32_kernel<<<1, 1, 0, stream>>>(acc, out);
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

void launch_grad_stats_chunks(const void* x, DType type, int64_t n, double* chunk_sums, unsigned long long* non_finite,
                              cudaStream_t stream) {
  if (n <= 0) return;
  switch (type) {
    case DType::f32:
      return launch_typed<DType::f32>(x, n, chunk_sums, non_finite, stream);
    case DType::bf16:
      return launch_typed<DType::bf16>(x, n, chunk_sums, non_finite, stream);
    case DType::f16:
      return launch_typed<DType::f16>(x, n, chunk_sums, non_finite, stream);
  }
}

}  // namespace zero3::detail::cuda

// Counter-based initialisation on the device: one thread per Philox block of four elements, the same
// philox_fill_block the cpu driver (kernels/philox_init_cpu.cpp) runs, so an element gets the same value
// wherever it is filled.
#include "core/check.hpp"
#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/launch_config.cuh"
#include "zero3/error.hpp"

namespace zero3::detail::cuda {
namespace {

__global__ void philox_fill_kernel(float* out, FillSpec spec, uint64_t seed, uint64_t param_stream, int64_t begin,
                                   int64_t end, int64_t first_block, int64_t blocks) {
  for (int64_t b = global_thread(); b < blocks; b += grid_threads()) {
    const int64_t block = first_block + b;
    float values[4];
    philox_fill_block(spec, seed, param_stream, static_cast<uint64_t>(block), values);
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t index = block * 4 + lane;
      if (index >= begin && index < end) out[index - begin] = values[lane];
    }
  }
}

}  // namespace

void launch_philox_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin,
                        int64_t end, cudaStream_t stream) {
  ZERO3_REQUIRE(begin >= 0 && end >= begin, InvalidArgument, "cuda init_fill: element range [", begin, ", ", end,
                ") is not a valid range");
  if (end == begin) return;
  ZERO3_REQUIRE(out != nullptr, InvalidArgument, "cuda init_fill: output is null for ", end - begin, " elements");
  const int64_t first_block = begin / 4;
  const int64_t blocks = (end - 1) / 4 - first_block + 1;
  philox_fill_kernel<<<blocks_for(blocks), kThreads, 0, stream>>>(out, spec, seed, param_stream, begin, end,
                                                                  first_block, blocks);
  ZERO3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero3::detail::cuda

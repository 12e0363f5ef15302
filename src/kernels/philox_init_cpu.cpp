#include <cstdint>

#include "core/check.hpp"
#include "kernels/philox_init.hpp"
#include "zero3/error.hpp"

namespace zero3 {

void philox_fill_cpu(const FillSpec& spec, uint64_t seed, uint64_t stream, int64_t begin, int64_t end, float* out) {
  ZERO3_REQUIRE(begin >= 0 && end >= begin, InvalidArgument, "philox_fill_cpu: element range [", begin, ", ", end,
                ") is not a valid range");
  if (end == begin) return;
  ZERO3_REQUIRE(out != nullptr, InvalidArgument, "philox_fill_cpu: output is null for ", end - begin, " elements");
  // Work in whole blocks of four; the first and last block may be partial.
  int64_t first_block = begin / 4;
  int64_t last_block = (end - 1) / 4;
#pragma omp parallel for schedule(static) if (last_block - first_block > 4096)
  for (int64_t block = first_block; block <= last_block; ++block) {
    float values[4];
    philox_fill_block(spec, seed, stream, static_cast<uint64_t>(block), values);
    int64_t base = block * 4;
    for (int lane = 0; lane < 4; ++lane) {
      int64_t index = base + lane;
      if (index >= begin && index < end) out[index - begin] = values[lane];
    }
  }
}

}  // namespace zero3

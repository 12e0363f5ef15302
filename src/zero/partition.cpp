#include "zero/partition.hpp"

#include <algorithm>

namespace zero3::detail {

SliceInfo slice_of(int64_t numel, int world_size, int rank) {
  SliceInfo s;
  s.rank = rank;
  s.size = slice_numel(numel, world_size);
  s.offset = static_cast<int64_t>(rank) * s.size;
  s.valid = std::clamp<int64_t>(numel - s.offset, 0, s.size);
  return s;
}

std::vector<ParamRange> params_in_range(const std::vector<int64_t>& offsets, const std::vector<int64_t>& numels,
                                        int64_t begin, int64_t length) {
  std::vector<ParamRange> out;
  int64_t end = begin + length;
  for (size_t i = 0; i < offsets.size(); ++i) {
    int64_t lo = std::max(offsets[i], begin);
    int64_t hi = std::min(offsets[i] + numels[i], end);
    if (lo >= hi) continue;
    out.push_back({static_cast<int32_t>(i), lo - offsets[i], hi - offsets[i], lo - begin});
  }
  return out;
}

}  // namespace zero3::detail

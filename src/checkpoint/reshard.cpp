#include "checkpoint/reshard.hpp"

#include <algorithm>

namespace zero3::ckpt {

std::vector<RangeRead> plan_reads(const CheckpointInfo& info, int unit, int64_t begin, int64_t length) {
  std::vector<RangeRead> reads;
  const int64_t end = std::min(begin + length, info.units.at(static_cast<size_t>(unit)).numel);
  for (size_t f = 0; f < info.files.size(); ++f) {
    const auto& ranges = info.files[f].ranges;
    for (size_t k = 0; k < ranges.size(); ++k) {
      const CheckpointRange& r = ranges[k];
      if (r.unit != unit) continue;
      const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.begin + r.length);
      if (lo >= hi) continue;
      reads.push_back({static_cast<int>(f), static_cast<int>(k), lo - r.begin, lo - begin, hi - lo});
    }
  }
  std::sort(reads.begin(), reads.end(),
            [](const RangeRead& x, const RangeRead& y) { return x.dst_offset < y.dst_offset; });
  return reads;
}

}  // namespace zero3::ckpt

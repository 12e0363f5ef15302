// Partitioning a unit's flat buffer into one contiguous, equal, padded slice per rank. Pure arithmetic:
// used by the engine, its memory queries and the checkpoint code.
//
//   flat buffer:  | p0 ........ | p1 ... | p2 ......... |pad|
//   slices:       | rank 0      | rank 1       | rank 2     |
//                 0             S             2S           3S = padded_numel,  S = ceil(numel / W)
#pragma once

#include <cstdint>
#include <vector>

#include "zero3/unit.hpp"

namespace zero3::detail {

inline int64_t slice_numel(int64_t numel, int world_size) {
  return numel == 0 ? 0 : (numel + world_size - 1) / world_size;
}

// Rank `rank`'s slice of a unit of `numel` elements.
SliceInfo slice_of(int64_t numel, int world_size, int rank);

// The parts of `params` (offset and numel of each, in unit order) that fall into [begin, begin + length)
// of the flat buffer, with offsets relative to `begin`.
struct ParamRange {
  int32_t param_index = 0;  // index into the unit's parameter list
  int64_t param_begin = 0;
  int64_t param_end = 0;
  int64_t local_offset = 0;
};
std::vector<ParamRange> params_in_range(const std::vector<int64_t>& offsets, const std::vector<int64_t>& numels,
                                        int64_t begin, int64_t length);

}  // namespace zero3::detail

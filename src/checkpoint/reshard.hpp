// Resharding: which byte ranges of which saved files cover a slice of a unit, for any saved and any current
// world size (or stage). Pure arithmetic on the manifest; the reader and the consolidation both follow it.
#pragma once

#include <cstdint>
#include <vector>

#include "zero3/checkpoint.hpp"

namespace zero3::ckpt {

// Copy `count` elements from element `src_offset` of a file's tensors for one range to element `dst_offset`
// of the destination slice.
struct RangeRead {
  int file = 0;   // index into CheckpointInfo::files
  int range = 0;  // index into that file's ranges
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  int64_t count = 0;
};

// The reads that fill elements [begin, begin + length) of unit `unit`'s flat buffer, in order of dst_offset.
// Elements at or past the unit's numel (padding) are not read: the caller zero-fills them. The manifest's
// ranges tile every unit (read_manifest checks it), so the reads cover [begin, min(begin + length, numel)).
std::vector<RangeRead> plan_reads(const CheckpointInfo& info, int unit, int64_t begin, int64_t length);

}  // namespace zero3::ckpt

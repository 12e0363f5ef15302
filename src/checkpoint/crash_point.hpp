// Fault injection for the checkpoint tests: ZERO3_TEST_CRASH_AT=<point>[@<rank>] makes the process end at once
// (_exit, no cleanup, no flush of anything but the log line) when it reaches that point of a save, as a killed
// job would. Without the variable a crash point costs one comparison.
//
// Points, in the order a save reaches them:
//   shard_partial    a rank has written part of its shard file (the first unit's tensors)
//   after_shards     a rank's shard file is complete and fsync'ed, before the ranks agree
//   before_manifest  rank 0, every shard written, before manifest.json
//   before_rename    rank 0, manifest.json written, before DIR/.tmp-TAG-* becomes DIR/TAG
//   replace_between_renames  rank 0, replacing DIR/TAG without an exchange: the old one moved away, the new
//                    one not yet in place
//   before_latest    rank 0, DIR/TAG in place, before DIR/latest names it
//   before_cleanup   rank 0, DIR/latest updated, before the replaced checkpoint is removed
#pragma once

namespace zero3::ckpt {

// The exit status of a process ended by a crash point.
inline constexpr int kCrashExitStatus = 86;

// Ends the process when ZERO3_TEST_CRASH_AT names `point` (and `rank`, or no rank).
void crash_point(const char* point, int rank = 0);

}  // namespace zero3::ckpt

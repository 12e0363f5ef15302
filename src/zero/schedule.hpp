// The stage-3 schedule: the recorded order of unit scopes and the decisions taken along it.
//
// The engine records every scope entry (unit, forward/backward) of a micro-step. At the end of a
// micro-step that order becomes the trace the next micro-step follows. While the running micro-step
// follows the trace (its events so far equal the trace's first events), the schedule can look ahead:
//
//   trace:    F0 F1 F2 F3 B3 B2 B1 B0
//   now:            ^ position 2 (F2 just entered)
//   prefetch: F3, then B3... skipping units already gathered: the first unit ahead always (when
//             stage3_prefetch_bucket_size > 0), more while the elements fetched ahead stay within
//             stage3_prefetch_bucket_size; never beyond stage3_max_live_parameters gathered elements;
//   release:  when F2's scope closes, F2 is kept if its next use (B2) comes within
//             stage3_max_reuse_distance elements of other units' gathers;
//   read:     with NVMe parameter offload, the slices of the next units to gather (F3, B3, ...; those not
//             gathered) are read from the swap file ahead, as many as there are free read buffers.
//   start:    at the end of a micro-step the next one's first units (F0, F1, ... by the same rule from the
//             trace's start, nothing gathered: plan_start) are gathered ahead; within the accumulation window
//             the engine keeps those of them still gathered from their last use (B0) instead.
//
// When the order departs from the trace, look-ahead stops for the rest of the micro-step and the new
// order becomes the trace. All decisions depend only on the trace and the engine's state, which are equal
// on every rank once the orders have been checked equal, so every rank issues the same collectives.
// Pure logic: no memory, no communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "zero3/engine.hpp"

namespace zero3::detail {

struct SchedulePolicy {
  int64_t prefetch_bucket_numel = 0;  // stage3_prefetch_bucket_size
  int64_t max_live_numel = 0;         // stage3_max_live_parameters
  int64_t max_reuse_distance = 0;     // stage3_max_reuse_distance
};

class Schedule {
 public:
  Schedule(SchedulePolicy policy, std::vector<int64_t> unit_numel, std::vector<bool> persistent);

  // Appends an entry to the running micro-step; returns its position.
  int64_t record(ScheduleEvent event);
  // Ends the micro-step: its order becomes the trace. Returns true when it differs from the previous trace
  // (always true for the first micro-step).
  bool finish_micro_step();

  bool has_trace() const { return !trace_.empty(); }
  bool following() const { return has_trace() && following_; }
  const std::vector<ScheduleEvent>& trace() const { return trace_; }
  const std::vector<ScheduleEvent>& current() const { return current_; }

  // Units to all-gather ahead after the entry just recorded, in trace order. `ahead_numel`: elements
  // already gathered ahead and not yet used; `live_numel`: elements of non-persistent units gathered or in
  // flight. `gatherable(u)`: u is neither gathered nor in flight.
  std::vector<UnitId> plan_prefetch(int64_t ahead_numel, int64_t live_numel,
                                    const std::function<bool(UnitId)>& gatherable) const;
  // The next micro-step's first units: what plan_prefetch gives at the trace's start with nothing gathered (the
  // first non-persistent unit always, more within stage3_prefetch_bucket_size and stage3_max_live_parameters).
  // Empty without a trace.
  std::vector<UnitId> plan_start() const;

  // Units whose NVMe slices to read ahead after the entry just recorded (or, at the start of a micro-step, from
  // the trace's start): the next at most `count` distinct non-persistent units in trace order for which
  // `needs_read(u)` holds. Nothing when the micro-step left the trace (or there is none yet).
  std::vector<UnitId> plan_reads(size_t count, const std::function<bool(UnitId)>& needs_read) const;

  // Position in the trace of the next use of `unit` from now on, or -1 when the trace has none (or the
  // micro-step left the trace).
  int64_t next_use(UnitId unit) const;
  // Whether a unit whose scope closes now stays gathered for its next use: that use is in the trace and the
  // elements of other units entered before it are at most max_reuse_distance.
  bool keep_for_reuse(UnitId unit) const;

  const SchedulePolicy& policy() const { return policy_; }

 private:
  void index_trace();
  std::vector<UnitId> plan_from(size_t position, int64_t ahead_numel, int64_t live_numel,
                                const std::function<bool(UnitId)>& gatherable) const;

  SchedulePolicy policy_;
  std::vector<int64_t> unit_numel_;
  std::vector<bool> persistent_;
  std::vector<ScheduleEvent> trace_;
  std::vector<ScheduleEvent> current_;
  bool following_ = true;
  std::vector<std::vector<int64_t>> positions_;  // per unit: its positions in the trace, ascending
  std::vector<int64_t> prefix_numel_;            // prefix_numel_[i] = sum of numel of trace[0, i)
};

}  // namespace zero3::detail

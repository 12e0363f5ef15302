// What step() leaves gathered at stage 3 besides the persistent units: the next micro-step's first units, by the
// rule docs/gpu.md states ("Prefetch across the micro-step boundary"), computed here from the recorded order and the
// config alone: along the order from its start, the first non-persistent unit always, then the next distinct ones
// while their elements stay within stage3_prefetch_bucket_size and stage3_max_live_parameters; none with a
// bucket of 0, or before any order is recorded.
#pragma once

#include <cstdint>
#include <vector>

#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"

namespace zero3::testing {

inline std::vector<UnitId> next_micro_step_first_units(const Engine& e) {
  std::vector<UnitId> out;
  const ZeroConfig& z = e.config().zero;
  if (e.stage() != 3 || !z.prefetch_bucket_size || *z.prefetch_bucket_size <= 0) return out;
  std::vector<bool> chosen(e.num_units(), false);
  int64_t numel = 0;
  for (const ScheduleEvent& ev : e.recorded_order()) {
    const UnitInfo& u = e.unit(ev.unit);
    if (u.persistent || chosen[static_cast<size_t>(ev.unit.index)]) continue;
    if (numel > 0 && numel + u.numel > *z.prefetch_bucket_size) break;
    if (numel + u.numel > z.max_live_parameters) break;
    chosen[static_cast<size_t>(ev.unit.index)] = true;
    out.push_back(ev.unit);
    numel += u.numel;
  }
  return out;
}

// The first unit along the recorded order that step() did not gather ahead: the next micro-step's first gather
// (issued ahead when its first scope opens).
inline UnitId first_unit_not_gathered_ahead(const Engine& e) {
  const std::vector<UnitId> first = next_micro_step_first_units(e);
  for (const ScheduleEvent& ev : e.recorded_order()) {
    if (e.unit(ev.unit).persistent) continue;
    bool ahead = false;
    for (UnitId u : first) ahead = ahead || u == ev.unit;
    if (!ahead) return ev.unit;
  }
  return UnitId{};
}

// Enters (and closes) the forward scopes of the recorded order one after the other.
inline void forward_along_the_order(Engine& e) {
  for (const ScheduleEvent& ev : e.recorded_order()) {
    if (ev.phase == Phase::forward) e.forward_scope(ev.unit).close();
  }
}

// Their gathered bytes (padded, in the compute dtype).
inline int64_t gathered_bytes(const Engine& e, const std::vector<UnitId>& units) {
  int64_t bytes = 0;
  for (UnitId id : units) {
    const UnitInfo& u = e.unit(id);
    bytes += u.padded_numel * static_cast<int64_t>(dtype_size(u.dtype));
  }
  return bytes;
}

}  // namespace zero3::testing

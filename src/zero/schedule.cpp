#include "zero/schedule.hpp"

#include <algorithm>

namespace zero3::detail {

Schedule::Schedule(SchedulePolicy policy, std::vector<int64_t> unit_numel, std::vector<bool> persistent)
    : policy_(policy), unit_numel_(std::move(unit_numel)), persistent_(std::move(persistent)) {
  positions_.resize(unit_numel_.size());
}

int64_t Schedule::record(ScheduleEvent event) {
  int64_t pos = static_cast<int64_t>(current_.size());
  current_.push_back(event);
  if (following_ && (pos >= static_cast<int64_t>(trace_.size()) || !(trace_[static_cast<size_t>(pos)] == event))) {
    following_ = false;
  }
  return pos;
}

bool Schedule::finish_micro_step() {
  bool changed = current_ != trace_;
  if (changed) {
    trace_ = std::move(current_);
    index_trace();
  }
  current_.clear();
  following_ = true;
  return changed;
}

void Schedule::index_trace() {
  for (auto& p : positions_) p.clear();
  prefix_numel_.assign(trace_.size() + 1, 0);
  for (size_t i = 0; i < trace_.size(); ++i) {
    auto u = static_cast<size_t>(trace_[i].unit.index);
    positions_[u].push_back(static_cast<int64_t>(i));
    prefix_numel_[i + 1] = prefix_numel_[i] + unit_numel_[u];
  }
}

std::vector<UnitId> Schedule::plan_prefetch(int64_t ahead_numel, int64_t live_numel,
                                            const std::function<bool(UnitId)>& gatherable) const {
  if (!following()) return {};
  return plan_from(current_.size(), ahead_numel, live_numel, gatherable);
}

std::vector<UnitId> Schedule::plan_start() const {
  return plan_from(0, 0, 0, [](UnitId) { return true; });
}

std::vector<UnitId> Schedule::plan_from(size_t position, int64_t ahead_numel, int64_t live_numel,
                                        const std::function<bool(UnitId)>& gatherable) const {
  std::vector<UnitId> out;
  std::vector<bool> chosen(unit_numel_.size(), false);
  for (size_t j = position; j < trace_.size(); ++j) {
    UnitId u = trace_[j].unit;
    auto ui = static_cast<size_t>(u.index);
    if (persistent_[ui] || chosen[ui] || !gatherable(u)) continue;
    int64_t n = unit_numel_[ui];
    // The bucket bounds what is fetched beyond the first unit ahead: a unit larger than the bucket (a
    // transformer layer under "auto", 0.9 * hidden^2) is still fetched while the current one computes.
    if (policy_.prefetch_bucket_numel <= 0) break;
    if (ahead_numel > 0 && ahead_numel + n > policy_.prefetch_bucket_numel) break;
    if (live_numel + n > policy_.max_live_numel) break;
    chosen[ui] = true;
    out.push_back(u);
    ahead_numel += n;
    live_numel += n;
  }
  return out;
}

std::vector<UnitId> Schedule::plan_reads(size_t count, const std::function<bool(UnitId)>& needs_read) const {
  std::vector<UnitId> out;
  if (!following()) return out;
  std::vector<bool> seen(unit_numel_.size(), false);
  for (size_t j = current_.size(); j < trace_.size() && out.size() < count; ++j) {
    UnitId u = trace_[j].unit;
    auto ui = static_cast<size_t>(u.index);
    if (persistent_[ui] || seen[ui]) continue;
    seen[ui] = true;
    if (needs_read(u)) out.push_back(u);
  }
  return out;
}

int64_t Schedule::next_use(UnitId unit) const {
  if (!following()) return -1;
  const auto& pos = positions_[static_cast<size_t>(unit.index)];
  auto it = std::lower_bound(pos.begin(), pos.end(), static_cast<int64_t>(current_.size()));
  return it == pos.end() ? -1 : *it;
}

bool Schedule::keep_for_reuse(UnitId unit) const {
  int64_t next = next_use(unit);
  if (next < 0) return false;
  int64_t distance = prefix_numel_[static_cast<size_t>(next)] - prefix_numel_[current_.size()];
  return distance <= policy_.max_reuse_distance;
}

}  // namespace zero3::detail

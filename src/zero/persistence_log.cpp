#include "zero/persistence_log.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "zero3/log.hpp"

namespace zero3::detail {

void log_persistence(const std::vector<UnitState>& units, int64_t threshold, int64_t model_threshold, int world) {
  std::string names;
  int64_t kept = 0, kept_numel = 0, total_numel = 0, largest = 0, smallest = INT64_MAX, small_dropped = 0;
  for (const UnitState& u : units) {
    total_numel += u.info.numel;
    largest = std::max(largest, u.info.numel);
    smallest = std::min(smallest, u.info.numel);
    if (!u.info.persistent) {
      if (u.info.numel <= threshold) ++small_dropped;
      continue;
    }
    if (++kept <= 8) names += log::concat(kept > 1 ? ", '" : "'", u.info.name, "'");
    kept_numel += u.info.numel;
  }
  if (kept > 8) names += log::concat(" and ", kept - 8, " more");
  const std::string rule = log::concat(
      "units of at most ", threshold, " elements (stage3_param_persistence_threshold)",
      model_threshold == INT64_MAX
          ? std::string()
          : log::concat(", up to ", model_threshold, " elements in all (stage3_model_persistence_threshold)"));
  if (kept == 0) {
    log::info_rank0("stage 3: no unit stays gathered, so every unit is gathered for each use (the smallest has ",
                    smallest, " elements; kept would be ", rule, ")");
    return;
  }
  log::info_rank0("stage 3: ", kept, " of ", units.size(), " units stay gathered for good on every rank (", kept_numel,
                  " of ", total_numel, " elements): ", names, "; kept are ", rule,
                  small_dropped > 0 ? log::concat("; ", small_dropped, " more small unit(s) are sharded past that cap")
                                    : std::string());
  if (kept == static_cast<int64_t>(units.size()) && world > 1) {
    log::warn_rank0("stage 3: every unit stays gathered (the largest has ", largest, " elements; kept are ", rule,
                    "), so each rank holds all ", total_numel,
                    " parameters as at stage 2 and stage 3 saves no "
                    "parameter memory; set stage3_param_persistence_threshold below ",
                    largest, " to shard the larger units");
  }
}

}  // namespace zero3::detail

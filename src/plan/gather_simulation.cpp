#include "plan/gather_simulation.hpp"

#include <algorithm>
#include <cstdint>

namespace zero3::detail {

SimulatedGathers simulate_gathers(const std::vector<SimulatedUnit>& units, int64_t prefetch_bucket, int64_t max_live,
                                  int64_t max_reuse_distance, bool keep_first_units) {
  const int64_t n = static_cast<int64_t>(units.size());
  std::vector<int64_t> trace;
  for (int64_t i = 0; i < n; ++i) trace.push_back(i);
  for (int64_t i = n - 1; i >= 0; --i) trace.push_back(i);
  const int64_t len = static_cast<int64_t>(trace.size());
  std::vector<int64_t> prefix(static_cast<size_t>(len) + 1, 0);
  for (int64_t i = 0; i < len; ++i) prefix[i + 1] = prefix[i] + units[trace[i]].numel;
  auto next_use = [&](int64_t unit, int64_t after) {  // first position >= after, or -1
    for (int64_t j = after; j < len; ++j) {
      if (trace[j] == unit) return j;
    }
    return int64_t{-1};
  };

  // The next micro-step's first units (Schedule::plan_start's rule).
  std::vector<bool> first(units.size(), false);
  if (keep_first_units && prefetch_bucket > 0) {
    int64_t first_numel = 0;
    for (int64_t u = 0; u < n; ++u) {
      if (units[u].persistent) continue;
      const int64_t with = first_numel + units[u].numel;
      if (with > max_live || (first_numel > 0 && with > prefetch_bucket)) break;
      first[u] = true;
      first_numel = with;
    }
  }
  std::vector<bool> gathered(units.size(), false), kept(units.size(), false), ahead(units.size(), false);
  int64_t live = 0, live_padded = 0, ahead_numel = 0;
  SimulatedGathers sim;
  sim.gathers.assign(units.size(), 0);
  auto gather = [&](int64_t u) {
    gathered[u] = true;
    sim.gathers[static_cast<size_t>(u)]++;
    live += units[u].numel;
    live_padded += units[u].padded;
    sim.peak_numel = std::max(sim.peak_numel, live);
    sim.peak_padded = std::max(sim.peak_padded, live_padded);
  };
  auto release = [&](int64_t u) {
    if (!gathered[u]) return;
    gathered[u] = kept[u] = false;
    live -= units[u].numel;
    live_padded -= units[u].padded;
    if (ahead[u]) ahead_numel -= units[u].numel;
    ahead[u] = false;
  };

  for (int64_t pos = 0; pos < len; ++pos) {
    const int64_t u = trace[pos];
    const bool persistent = units[u].persistent;  // gathered for good; never counted as live
    if (!persistent) {
      if (ahead[u]) {
        ahead[u] = false;
        ahead_numel -= units[u].numel;
      }
      kept[u] = false;
      if (!gathered[u]) {
        // Make room: evict kept units, the one used last first; the entered unit is gathered regardless.
        while (live + units[u].numel > max_live) {
          int64_t victim = -1, victim_next = 0;
          for (int64_t o = 0; o < n; ++o) {
            if (!kept[o]) continue;
            int64_t next = next_use(o, pos + 1);
            int64_t key = next < 0 ? INT64_MAX : next;
            if (victim < 0 || key > victim_next) {
              victim = o;
              victim_next = key;
            }
          }
          if (victim < 0) break;
          release(victim);
        }
        gather(u);
      }
    }
    // Prefetch along the order (after any entry, persistent units' included), by Schedule::plan_from's rule: the
    // bucket bounds what is fetched beyond the first unit ahead, so a unit larger than the bucket is still fetched.
    for (int64_t j = pos + 1; j < len && prefetch_bucket > 0; ++j) {
      const int64_t v = trace[j];
      if (units[v].persistent || gathered[v]) continue;
      if ((ahead_numel > 0 && ahead_numel + units[v].numel > prefetch_bucket) || live + units[v].numel > max_live) {
        break;
      }
      gather(v);
      ahead[v] = true;
      ahead_numel += units[v].numel;
    }
    if (persistent) continue;
    // Scope exit: keep for a near reuse, else release.
    int64_t next = next_use(u, pos + 1);
    bool keep = next >= 0 && prefix[next] - prefix[pos + 1] <= max_reuse_distance && live <= max_live;
    if (keep || (next < 0 && first[u])) {
      kept[u] = true;
    } else {
      release(u);
    }
  }
  sim.kept_at_end.assign(units.size(), false);
  for (int64_t u = 0; u < n; ++u) sim.kept_at_end[static_cast<size_t>(u)] = first[u] && kept[u];
  return sim;
}

int64_t gather_scratch_bytes(int64_t piece, int pieces, int staged, bool quantized, const QuantFormat& format,
                             int64_t element_size) {
  if (!quantized) return staged * piece * element_size;
  return (1 + pieces + staged) * quant_message_bytes(piece, format);
}

}  // namespace zero3::detail

// A replay of the stage-3 gather rules over one steady-state micro-step, from unit sizes alone: what the memory
// plan needs (the most elements gathered at once) and what the traffic plan needs (how many all-gathers each unit
// costs per micro-step). Pure arithmetic, no engine.
//
// The order is every unit's forward scope in declaration order, then every backward scope in reverse (a model
// without activation checkpointing). The rules are the engine's (schedule.hpp): prefetch along the order within
// stage3_prefetch_bucket_size elements ahead and stage3_max_live_parameters gathered; a
// closing unit kept when its next use is within stage3_max_reuse_distance elements; kept units evicted (farthest
// next use first) to make room under stage3_max_live_parameters; the entered unit always gathered. Caps and
// distances count unpadded elements, as the engine does. Persistent units stay gathered and are not replayed.
// Nothing stays gathered from one micro-step to the next: the last scopes of a micro-step have no next use in it.
#pragma once

#include <cstdint>
#include <vector>

namespace zero3::detail {

struct ReplayUnit {
  int64_t numel = 0;   // unpadded elements
  int64_t padded = 0;  // elements of its full buffer
  bool persistent = false;
};

struct GatherReplay {
  int64_t peak_live_numel = 0;   // most unpadded elements of non-persistent units gathered or in flight at once
  int64_t peak_live_padded = 0;  // the same in padded elements (buffer sizes)
  // Per unit: the all-gathers issued in one micro-step for its forward scope and for its backward scope (0 or 1
  // each; 0 for persistent units, and for a backward scope whose unit was kept gathered since its forward scope).
  std::vector<int> forward_gathers;
  std::vector<int> backward_gathers;
};

// Marks the units that stay gathered, as the engine decides at materialize(): in declaration order, each unit of at
// most `threshold` elements (stage3_param_persistence_threshold) while the persistent elements stay within
// `model_threshold` (stage3_model_persistence_threshold).
void mark_persistent(std::vector<ReplayUnit>& units, int64_t threshold, int64_t model_threshold);

GatherReplay replay_micro_step(const std::vector<ReplayUnit>& units, int64_t prefetch_bucket, int64_t max_live,
                               int64_t max_reuse_distance);

}  // namespace zero3::detail

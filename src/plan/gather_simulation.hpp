// The engine's stage-3 gather rules replayed over one steady-state micro-step, from unit sizes alone: how many
// elements are gathered at the worst moment (the memory plan) and how often each unit is gathered (the traffic
// plan). The micro-step is every unit's forward scope in declaration order, then every backward scope in reverse (a
// model without activation checkpointing), with the rules of schedule.hpp: prefetch along the order within
// stage3_prefetch_bucket_size elements ahead and stage3_max_live_parameters gathered; a closing unit kept when its
// next use is within stage3_max_reuse_distance elements; kept units evicted (farthest next use first) to make room
// under stage3_max_live_parameters; the entered unit always gathered. Caps and distances count unpadded elements, as
// the engine does; buffers are padded.
// With `keep_first_units` the micro-step is one within the accumulation window: a closing unit with no further use
// that is among the next micro-step's first units (from the order's start: the first non-persistent unit always,
// more within the bucket and the live cap) stays gathered, evictable, and is counted in `kept_at_end` when it is
// still gathered at the end (the next micro-step finds it; its gather there is saved). The micro-step itself starts
// as the engine's does in steady state: the first units gathered ahead at the end of the previous one lead to the
// same state after the first entry as gathering the first unit on entry and prefetching from there.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/block_quantize.hpp"

namespace zero3::detail {

struct SimulatedUnit {
  int64_t numel = 0;
  int64_t padded = 0;
  bool persistent = false;  // gathered for good: never counted, never gathered in a micro-step
};

struct SimulatedGathers {
  int64_t peak_numel = 0;         // most elements of non-persistent units gathered or in flight at once
  int64_t peak_padded = 0;        // the same, padded
  std::vector<int64_t> gathers;   // per unit: all-gathers issued in the micro-step (0 for persistent units)
  std::vector<bool> kept_at_end;  // per unit: kept gathered into the next micro-step (keep_first_units)
};

SimulatedGathers simulate_gathers(const std::vector<SimulatedUnit>& units, int64_t prefetch_bucket, int64_t max_live,
                                  int64_t max_reuse_distance, bool keep_first_units = false);

// The scratch one stage-3 gather holds while in flight (EngineImpl::issue_gather, freed in wait_gather), for pieces of
// `piece` elements from each of `pieces` ranks: with qwZ (`quantized`), this rank's int8 message and every rank's, 1 +
// pieces messages of quant_message_bytes(piece, format); with MiCS's hierarchical gather, the inter-node stage's
// `staged` pieces (messages under qwZ, else `piece` elements of `element_size` bytes); 0 when neither.
int64_t gather_scratch_bytes(int64_t piece, int pieces, int staged, bool quantized, const QuantFormat& format,
                             int64_t element_size);

}  // namespace zero3::detail

// The engine's gate on its config: it trains only a config that resolve() has seen, for this world size.
#pragma once

#include "zero3/config.hpp"

namespace zero3::detail {

// Throws ConfigError unless resolve() ran on `config` (Config::resolved) and its batch sizes fit `world`:
// train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world. The message of
// an unresolved config names every "auto" key still pending and every batch size not given. A pipeline stage's
// engine (`pipeline_stage`) passes its data-parallel group's size as `world` and may have pipeline.stages above 1;
// any other engine refuses pipeline.stages above 1 (PipelineEngine runs those).
void require_resolved(const Config& config, int world, bool pipeline_stage = false);

}  // namespace zero3::detail

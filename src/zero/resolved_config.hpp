// The engine's gate on its config: it trains only a config that resolve() has seen, for this world size.
#pragma once

#include "zero3/config.hpp"

namespace zero3::detail {

// Throws ConfigError unless resolve() ran on `config` (Config::resolved) and its batch sizes fit `world`:
// train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world. The message of
// an unresolved config names every "auto" key still pending and every batch size not given.
void require_resolved(const Config& config, int world);

}  // namespace zero3::detail

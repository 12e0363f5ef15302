// Where the offload tests put the optimizer state and the parameter slices: a config's offload sections set from
// two choices, as the stream-path, hpZ and MiCS offload tests need them; and the training run they compare.
#pragma once

#include <string>

#include "support/mlp_trainer.hpp"
#include "zero3/config.hpp"
#include "zero3/engine.hpp"

namespace zero3::testing {

enum class Where { none, cpu, nvme };

// Sets offload_optimizer and offload_param to `optimizer` and `param` (pin_memory `pin`, NVMe files under `dir`).
// NVMe optimizer offload pipelines its reads and writes over 4 buffers; NVMe parameter slices use 100,000-element
// buffers, so that the test model's units take several.
inline void apply_offload(Config& c, Where optimizer, Where param, bool pin, const std::string& dir) {
  auto set = [&](OffloadConfig& o, Where w) {
    if (w == Where::none) return;
    o.device = w == Where::cpu ? OffloadDevice::cpu : OffloadDevice::nvme;
    o.pin_memory = pin;
    if (w == Where::nvme) o.nvme_path = dir;
  };
  set(c.zero.offload_optimizer, optimizer);
  set(c.zero.offload_param, param);
  if (optimizer == Where::nvme) {
    c.zero.offload_optimizer.pipeline_read = true;
    c.zero.offload_optimizer.pipeline_write = true;
    c.zero.offload_optimizer.buffer_count = 4;
  }
  if (param == Where::nvme) c.zero.offload_param.buffer_size = 100'000;
}

// One model trained on `engine`: what the run produced, the schedule's counters and the memory it held.
struct Trained {
  EngineRun run;
  ScheduleStats stats;
  MemoryStats memory;
};

inline Trained train(Engine& engine, const TrainPlan& plan) {
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  Trained t;
  t.run = train_mlp(engine, units, plan);
  t.stats = engine.schedule_stats();
  t.memory = engine.memory();
  return t;
}

}  // namespace zero3::testing

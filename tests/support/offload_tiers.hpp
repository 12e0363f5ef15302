// Where the offload tests put the optimizer state and the parameter slices: a config's offload sections set from
// two choices, as the stream-path offload test and the hpZ offload test both need them.
#pragma once

#include <string>

#include "zero3/config.hpp"

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

}  // namespace zero3::testing

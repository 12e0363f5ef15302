// Checks across keys that need no facts from the program (stage vs offload, fp16 vs bf16, backend vs
// device). parse_config runs them, and resolve() runs them again on the final values. Internal.
#pragma once

#include "zero3/config.hpp"

namespace zero3::config_detail {

// Throws ConfigError "<key path>: got <value> with <other key> <value>, expected ... (in <source>)".
void check_static(const Config& c);

// The part of check_static about hpZ and MiCS (stage 3 only, one of the two, the hierarchical gather with MiCS);
// the engine runs it too, for configs built in code.
void check_layouts(const Config& c);

// ZeRO++'s quantized collectives need 16-bit compute: ConfigError naming zero_quantized_weights or
// zero_quantized_gradients when the config computes in fp32. Only where the precision is known: resolve() runs it
// when the program's precision or a bf16/fp16 section says it, the engine always.
void check_quantization_precision(const Config& c);

// hpZ's secondary partition is built on the device, from parameter slices that live there: with offload_param on
// a GPU (cpu or nvme), or to nvme on the cpu device, Unsupported naming zero_hpz_partition_size and the offload.
// `hpz`: the layout is hpZ (zero_hpz_partition_size above 1 and below the world size, as make_shard_layout decides);
// `on_gpu`: the engine's device is not the cpu device. `zero3 plan --advise` and `--layouts` call this to leave out
// the layouts the engine refuses. The engine's constructor (src/zero/engine_impl.cpp) still states the rule inline;
// it should call this instead, and until it does, tests/dist/test_engine_layout_errors.cpp holds the two to the same
// verdicts on the cpu device.
void check_hpz_param_offload(const Config& c, bool hpz, bool on_gpu);

}  // namespace zero3::config_detail

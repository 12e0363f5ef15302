#include "config/config_checks.hpp"

#include <tuple>
#include <utility>

#include "config/config_value.hpp"
#include "zero3/error.hpp"

namespace zero3::config_detail {
namespace {

[[noreturn]] void fail(const Config& c, const std::string& path, const std::string& message) {
  throw ConfigError(error_text(path, message, c.source));
}

const char* device_text(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "\"cpu\"" : d == OffloadDevice::nvme ? "\"nvme\"" : "\"none\"";
}

}  // namespace

void check_layouts(const Config& c) {
  // Layouts for slow links between nodes: stage 3 only (they decide how parameters are gathered), one at a time.
  const ZeroConfig& z = c.zero;
  const bool hpz = z.hpz_partition_size > 1, mics = z.mics_shard_size > 0;
  if (hpz && z.stage != 3) {
    fail(c, "zero_optimization.zero_hpz_partition_size",
         "got " + std::to_string(z.hpz_partition_size) + " with zero_optimization.stage " + std::to_string(z.stage) +
             ", expected zero_optimization.stage 3 (or 0/1 to turn hpZ off): hpZ keeps a secondary partition of the "
             "parameters, and only stage 3 partitions them");
  }
  if (mics && z.stage != 3) {
    fail(c, "zero_optimization.mics_shard_size",
         "got " + std::to_string(z.mics_shard_size) + " with zero_optimization.stage " + std::to_string(z.stage) +
             ", expected zero_optimization.stage 3 (or -1 to turn MiCS off): MiCS shards parameters, gradients and "
             "optimizer state within groups, which only stage 3 partitions together");
  }
  if (hpz && mics) {
    fail(c, "zero_optimization.zero_hpz_partition_size",
         "got " + std::to_string(z.hpz_partition_size) + " with zero_optimization.mics_shard_size " +
             std::to_string(z.mics_shard_size) +
             ", expected one of the two: MiCS gathers within its shard group and never reads hpZ's secondary copy "
             "(DeepSpeed keeps one it does not use); for a shard group of one node set mics_shard_size to the ranks "
             "per node alone");
  }
  for (const auto& [on, path, what] :
       {std::tuple<bool, const char*, const char*>{z.quantized_weights, "zero_optimization.zero_quantized_weights",
                                                   "qwZ quantizes the stage-3 parameter all-gathers"},
        {z.quantized_gradients, "zero_optimization.zero_quantized_gradients",
         "qgZ replaces the stage-3 gradient reduce-scatter (DeepSpeed's stage 1 and 2 never read the key)"}}) {
    if (on && z.stage != 3) {
      fail(c, path,
           "got true with zero_optimization.stage " + std::to_string(z.stage) + ", expected zero_optimization.stage 3 "
           "(or false): " + what);
    }
  }
  if (z.quantized_gradients && c.zero3.qgz_block_size % 2 != 0) {
    fail(c, "zero3.qgz_block_size",
         "got " + std::to_string(c.zero3.qgz_block_size) +
             ", expected an even number of elements: qgZ's int4 codes are packed two per byte, and a block must fill "
             "whole bytes");
  }
  if (z.mics_hierarchical_params_gather && !mics) {
    fail(c, "zero_optimization.mics_hierarchical_params_gather",
         "got true with zero_optimization.mics_shard_size " + std::to_string(z.mics_shard_size) +
             ", expected a positive mics_shard_size: the hierarchical gather is MiCS's way of gathering a shard group "
             "that spans nodes");
  }
}

void check_quantization_precision(const Config& c) {
  if (c.compute_dtype() != DType::f32) return;
  for (const auto& [on, path] : {std::pair<bool, const char*>{c.zero.quantized_weights,
                                                              "zero_optimization.zero_quantized_weights"},
                                 {c.zero.quantized_gradients, "zero_optimization.zero_quantized_gradients"}}) {
    if (on) {
      fail(c, path,
           "got true with fp32 compute (neither bf16.enabled nor fp16.enabled), expected bf16 or fp16 compute (or "
           "false): ZeRO++ quantizes the 16-bit weights and gradients of mixed-precision training; an fp32 run "
           "would lose more than half of its mantissa on every gather");
    }
  }
}

void check_hpz_param_offload(const Config& c, bool hpz, bool on_gpu) {
  const OffloadDevice param = c.zero.offload_param.device;
  if (!hpz || param == OffloadDevice::none || (param == OffloadDevice::cpu && !on_gpu)) return;
  throw Unsupported("zero_optimization.zero_hpz_partition_size: " + std::to_string(c.zero.hpz_partition_size) +
                    " with offload_param.device = " + (param == OffloadDevice::nvme ? "nvme" : "cpu") +
                    (on_gpu ? " on a GPU" : " on the cpu device") +
                    ": a secondary partition of offloaded parameters is not built yet; use hpZ or parameter offload");
}

void check_static(const Config& c) {
  if (c.fp16.enabled && c.bf16.enabled) {
    fail(c, "bf16.enabled",
         "got true together with fp16.enabled true, expected at most one of them: the compute type is either bf16 "
         "or fp16");
  }
  const ZeroConfig& z = c.zero;
  if (z.offload_param.device != OffloadDevice::none && z.stage != 3) {
    fail(c, "zero_optimization.offload_param.device",
         std::string("got ") + device_text(z.offload_param.device) + " with zero_optimization.stage " +
             std::to_string(z.stage) +
             ", expected zero_optimization.stage 3: only stage 3 partitions parameters, so only it can offload "
             "them (or set device \"none\")");
  }
  if (z.offload_optimizer.device != OffloadDevice::none && z.stage == 0) {
    fail(c, "zero_optimization.offload_optimizer.device",
         std::string("got ") + device_text(z.offload_optimizer.device) +
             " with zero_optimization.stage 0, expected zero_optimization.stage 1, 2 or 3: optimizer offload moves "
             "each rank's partition of the optimizer state, and stage 0 does not partition it");
  }
  if (z.offload_optimizer.device != OffloadDevice::none && z.offload_optimizer.ratio < 1.0 && z.stage != 3) {
    fail(c, "zero_optimization.offload_optimizer.ratio",
         "got " + show(z.offload_optimizer.ratio) + " with zero_optimization.stage " + std::to_string(z.stage) +
             ", expected 1.0: a partial optimizer offload needs stage 3 (as in DeepSpeed)");
  }
  check_layouts(c);
  const Zero3Section& s = c.zero3;
  if (s.comm_backend == "nccl" && s.device == "cpu") {
    fail(c, "zero3.comm_backend",
         "got \"nccl\" with zero3.device \"cpu\", expected \"gloo\" or \"auto\": NCCL works between CUDA devices");
  }
  if (s.network == NetworkTransport::efa && (s.comm_backend == "gloo" || s.device == "cpu")) {
    fail(c, "zero3.network",
         "got \"efa\" with zero3.comm_backend \"" + s.comm_backend + "\" and zero3.device \"" + s.device +
             "\", expected comm_backend \"nccl\" (or \"auto\" with a CUDA device): EFA is reached through NCCL's "
             "libfabric plugin");
  }
}

}  // namespace zero3::config_detail

#include "plan/step_time_parts.hpp"

#include <algorithm>
#include <iterator>

#include "core/check.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace zero3::detail {
namespace {

// Adam's memory traffic per parameter (bench_cpu_adam's count): read the fp32 master, gradient and both moments
// (16 B), write the master and moments (12 B) and the 16-bit copy (2 B).
constexpr double kAdamBytesPerParam = 30;
// NVMe optimizer offload reads and writes the fp32 master and both moments every step.
constexpr double kNvmeOptimizerBytesPerParam = 2 * 12;

}  // namespace

int64_t require_batch(const std::optional<int64_t>& v, const char* key) {
  ZERO3_REQUIRE(v.has_value(), ConfigError, key,
                ": still \"auto\"; give the batch (zero3 plan --micro-batch / --grad-accum) to model a step");
  ZERO3_REQUIRE(*v >= 1, ConfigError, key, ": ", *v, " must be at least 1");
  return *v;
}

double forward_flops_per_token(double matmul_elements, int64_t decoder_layers, const LlamaDims& d, int64_t seq_len) {
  const int64_t head_dim = d.head_dim > 0 ? d.head_dim : d.hidden_size / d.num_attention_heads;
  const double q_width = static_cast<double>(d.num_attention_heads * head_dim);
  const double context = (static_cast<double>(seq_len) + 1) / 2;
  return 2 * matmul_elements + 4 * context * q_width * static_cast<double>(decoder_layers);
}

PhaseBytes::PhaseBytes(const RankTraffic& t)
    : primary_gathers(t.gathers - t.boundary_gathers - t.secondary_gathers),
      secondary_gathers(t.secondary_gathers),
      reductions(t.reductions - t.boundary_reductions),
      boundary_gathers(t.boundary_gathers),
      boundary_reductions(t.boundary_reductions) {}

CollectiveTraffic PhaseBytes::micro() const {
  CollectiveTraffic m = primary_gathers;
  m += secondary_gathers;
  m += reductions;
  return m;
}

CollectiveTraffic PhaseBytes::boundary() const {
  CollectiveTraffic m = boundary_gathers;
  m += boundary_reductions;
  return m;
}

std::pair<double, std::string> busiest(double compute_s, double inter_node_s, double intra_node_s, double offload_s) {
  const std::pair<double, const char*> terms[] = {
      {compute_s, "compute"}, {inter_node_s, "inter-node"}, {intra_node_s, "intra-node"}, {offload_s, "offload"}};
  const auto* b = std::max_element(std::begin(terms), std::end(terms),
                                   [](const auto& x, const auto& y) { return x.first < y.first; });
  return {b->first, b->second};
}

HostCopies host_copies(const Config& config, int64_t ga, int64_t owned, int64_t primary_slice, int64_t secondary_fill,
                       int64_t secondary_read, bool deepspeed) {
  const ZeroConfig& z = config.zero;
  const int64_t c = static_cast<int64_t>(dtype_size(config.compute_dtype()));
  const bool param_off = z.offload_param.device != OffloadDevice::none;
  const bool optimizer_off = z.offload_optimizer.device != OffloadDevice::none;
  HostCopies h;
  if (param_off) h.micro_h2d += primary_slice * c;  // each gather from the primary partition brings the slice up
  if (config.zero3.hpz_secondary_on_host && !deepspeed) {
    // hpZ's secondary partition in host memory: filled once a step from the device, copied up before each gather
    // that reads it.
    h.micro_d2h += secondary_fill * c;
    h.micro_h2d += secondary_read * c;
  }
  if (optimizer_off) {
    if (deepspeed) {
      // stage3.py partition_grads: each micro-step's reduced partition goes to the pinned host buffer and comes
      // back to the device (to be added to, or as the device-side buffer), in the accumulation dtype; at the
      // boundary it goes down once more as fp32 for the optimizer.
      const int64_t acc = static_cast<int64_t>(dtype_size(config.grad_accum_dtype.value_or(config.compute_dtype())));
      h.micro_h2d += ga * owned * acc;
      h.micro_d2h += ga * owned * acc;
      h.step_d2h += owned * 4;
    } else {
      // The accumulator stays on the device; the optimizer step streams it down once.
      h.step_d2h += owned * static_cast<int64_t>(dtype_size(config.grad_accum_dtype.value_or(DType::f32)));
    }
    if (!param_off) h.step_h2d += owned * c;  // the new parameters go up (host slices are written in place)
  } else if (param_off) {
    h.step_d2h += owned * c;  // Adam on the GPU; the new slice goes to host memory
  }
  return h;
}

StepRest step_rest(const Config& config, const ClusterDesc& cluster, int64_t owned, int64_t ranks_per_node,
                   const HostCopies& copies) {
  const ZeroConfig& z = config.zero;
  const double c = static_cast<double>(dtype_size(config.compute_dtype()));
  const double node_owned = static_cast<double>(owned) * static_cast<double>(ranks_per_node);
  StepRest r;
  r.optimizer_s = z.offload_optimizer.device != OffloadDevice::none
                      ? node_owned * kAdamBytesPerParam / (cluster.cpu_memory_gb_s * 1e9)
                      : static_cast<double>(owned) * kAdamBytesPerParam / (cluster.gpu_memory_gb_s * 1e9);
  r.step_offload_s =
      static_cast<double>(std::max(copies.step_h2d, copies.step_d2h)) / (cluster.pcie_effective_gb_s() * 1e9);
  double nvme_bytes = 0;
  if (z.offload_optimizer.device == OffloadDevice::nvme) nvme_bytes += node_owned * kNvmeOptimizerBytesPerParam;
  if (z.offload_param.device == OffloadDevice::nvme) nvme_bytes += node_owned * c;
  r.nvme_s = nvme_bytes / (cluster.nvme_gb_s * 1e9);
  return r;
}

}  // namespace zero3::detail

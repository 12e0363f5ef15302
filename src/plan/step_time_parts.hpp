// The parts of the step-time model (step_time_model.hpp) that an unpipelined step and a pipelined one
// (pipeline_plan.hpp) share: the FLOPs of a run of units, one rank's bytes by phase, the busiest of a micro-step's
// overlapping terms, the copies between a GPU and host memory, and the optimizer's share of the step's boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::detail {

// A batch size the step needs: `v` resolved and at least 1, else ConfigError naming `key` and the zero3 plan flag.
int64_t require_batch(const std::optional<int64_t>& v, const char* key);

// The FLOPs of one token's forward pass through units with `matmul_elements` weights used as matrices (2 FLOPs per
// weight) and `decoder_layers` of a Llama's layers (attention's QK^T and AV over the causal context, on average
// (seq + 1) / 2 positions).
double forward_flops_per_token(double matmul_elements, int64_t decoder_layers, const LlamaDims& dims, int64_t seq_len);

// One rank's bytes of one optimizer step from plan_traffic(), by when they go and what they are.
struct PhaseBytes {
  // During the micro-steps.
  CollectiveTraffic primary_gathers;    // from the primary partition
  CollectiveTraffic secondary_gathers;  // hpZ's, from the secondary partition
  CollectiveTraffic reductions;
  // Once per step, outside them.
  CollectiveTraffic boundary_gathers;
  CollectiveTraffic boundary_reductions;

  explicit PhaseBytes(const RankTraffic& t);
  CollectiveTraffic micro() const;
  CollectiveTraffic boundary() const;
};

// A micro-step's terms run at once: the busiest sets its time, and names its bound.
std::pair<double, std::string> busiest(double compute_s, double inter_node_s, double intra_node_s, double offload_s);

// One GPU's copies to and from host memory per optimizer step: during the micro-steps and at the boundary.
struct HostCopies {
  int64_t micro_h2d = 0, micro_d2h = 0, step_h2d = 0, step_d2h = 0;
};
// `owned`: the rank's slice elements; primary_slice, secondary_fill, secondary_read: RankTraffic's
// primary_gather_elements, secondary_fill_elements, secondary_gather_elements (the busiest rank's).
HostCopies host_copies(const Config& config, int64_t grad_accum, int64_t owned, int64_t primary_slice,
                       int64_t secondary_fill, int64_t secondary_read, bool deepspeed);

// The optimizer boundary besides its collectives: Adam (on the CPU, shared by the node's `ranks_per_node` ranks, or
// on the GPU), the step's PCIe copies and NVMe traffic, in seconds.
struct StepRest {
  double optimizer_s = 0, step_offload_s = 0, nvme_s = 0;
};
StepRest step_rest(const Config& config, const ClusterDesc& cluster, int64_t owned, int64_t ranks_per_node,
                   const HostCopies& copies);

}  // namespace zero3::detail

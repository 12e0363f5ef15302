// The time of one optimizer step of a ZeRO stage-3 run on a cluster (cluster_desc.hpp), before anything runs:
// from the bytes each rank sends in its collectives (plan_traffic(), traffic_plan.hpp: the engine's own accounting,
// the one ScheduleStats counts and the topology benchmark measures), the bytes each GPU copies to and from host
// memory, the FLOPs of the model, and the optimizer's memory traffic. docs/performance-model.md explains the model, its
// inputs and their sources, and its calibration against a measured DeepSpeed run.
//
// Two data flows of the same config and model:
//   zero3      this engine: gathers and reductions per layout (plain, hpZ, MiCS/HSDP), gradients reduced in
//              Config::communication_dtype() and accumulated on the device in grad_accum_dtype (fp32 by default);
//              with offload_optimizer, the accumulated gradients go down once per optimizer step and, unless the
//              parameter slices live in host memory, the new parameters come up once; with offload_param, each
//              gather from the primary partition first copies the rank's slice up. With ZeRO++'s qwZ and qgZ
//              (zero_quantized_weights, zero_quantized_gradients), the int8 gathers and int4 all-to-alls the engine
//              sends, as plan_traffic() counts them.
//   deepspeed  DeepSpeed's plain ZeRO-3 (runtime/zero/stage3.py, partition_parameters.py) of the same config: every
//              gather over all ranks (hpZ, MiCS and ZeRO++ quantization keys ignored), gradients reduced in
//              communication_dtype(); with offload_param every gather first copies the partition up; with
//              offload_optimizer the gradient partitions live in pinned host memory in the accumulation dtype (the
//              model dtype unless data_types.grad_accum_dtype), and every micro-step copies each reduced partition down
//              and back up (stage3.py partition_grads: accumulate on the device, copy back), and the boundary copies it
//              down once more in fp32 for the optimizer.
// Both: the same unit granularity (the model's units; DeepSpeed gathers per module, so its collectives are
// smaller, which collective_efficiency covers) and the same gather schedule (prefetch, reuse distance, live cap).
//
// Timing. Within a micro-step, compute, the node link, the GPUs' intra-node links and the PCIe copies all run at
// once (prefetched gathers, reductions on their own stream, copies on copy streams): the micro-step takes as long
// as the busiest of them. After the last micro-step the boundary runs alone: its collectives (MiCS's all-reduce
// across replicas, persistent units' re-gathers), then the optimizer (CPU Adam at cpu_memory_gb_s shared by the
// node's ranks, or Adam on the GPU at gpu_memory_gb_s) overlapped with its PCIe copies and NVMe traffic. A step is
// grad_accum micro-steps plus the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3 {

enum class DataFlow { zero3, deepspeed };

struct StepTimeOptions {
  DataFlow flow = DataFlow::zero3;
  int64_t seq_len = 0;  // tokens per sequence (>= 1)
};

struct StepTime {
  DataFlow flow = DataFlow::zero3;
  std::string layout;  // e.g. "ZeRO-3 over 16 ranks", "hpZ groups of 4 ranks (one node)", plus "+ qwZ", "+ qgZ"
  int grad_accum = 1;
  int64_t tokens_per_gpu = 0;  // per optimizer step
  double flops_per_gpu = 0;    // per optimizer step

  // Bytes per optimizer step.
  int64_t node_inter_bytes = 0;     // what the busiest node's ranks send to other nodes (its link's load)
  int64_t cluster_inter_bytes = 0;  // what all nodes' ranks send to other nodes: every link's load, summed
  int64_t gpu_intra_bytes = 0;      // the most one rank sends to ranks of its node
  int64_t gpu_h2d_bytes = 0;        // the most one GPU copies from host memory
  int64_t gpu_d2h_bytes = 0;        // the most one GPU copies to host memory

  // One micro-step, in seconds. micro_step_s is the largest of the four; `bound` names it.
  double compute_s = 0;     // forward and backward
  double inter_node_s = 0;  // the node link's share of the micro-step's gathers and reductions
  double intra_node_s = 0;  // the busiest GPU's intra-node ring traffic
  double offload_s = 0;     // the busiest GPU's PCIe copies (and the node's NVMe reads of parameter slices)
  double micro_step_s = 0;
  std::string bound;  // "compute", "inter-node", "intra-node" or "offload"

  // Once per optimizer step, after the last micro-step, in seconds.
  double boundary_comm_s = 0;  // MiCS's replica all-reduce, persistent units' re-gathers
  double optimizer_s = 0;      // Adam: on the CPU (offload_optimizer) or on the GPU
  double step_offload_s = 0;   // PCIe copies of the step (gradients down, parameters up)
  double nvme_s = 0;           // NVMe traffic of the step (optimizer state, parameter slices written back)
  double boundary_s = 0;       // boundary_comm_s + max(optimizer_s, step_offload_s, nvme_s)

  double step_s = 0;  // grad_accum * micro_step_s + boundary_s

  // The same step with what ZeRO-3's collectives lose on the node link read the other way: as a fixed cost per
  // collective that crosses nodes (ClusterDesc::collective_overhead_ms) on top of the link's NCCL rate
  // (ClusterDesc::nccl_link_gb_s), instead of as a fraction of its bandwidth (collective_efficiency, the fields
  // above). fit_network() fits both readings to the same measured run; they bracket the prediction, which is the
  // range [step_low_s(), step_high_s()]. Without collective_overhead_ms in the cluster description the range is the
  // bandwidth reading alone (has_fixed_cost false, the fields below copies of those above).
  bool has_fixed_cost = false;
  int64_t inter_node_collectives = 0;  // per optimizer step: the most one rank issues over groups that span nodes
  double inter_node_fixed_s = 0;       // one micro-step's node link
  double micro_step_fixed_s = 0;
  std::string bound_fixed;
  double boundary_comm_fixed_s = 0;
  double boundary_fixed_s = 0;
  double step_fixed_s = 0;

  double step_low_s() const { return step_s < step_fixed_s ? step_s : step_fixed_s; }
  double step_high_s() const { return step_s < step_fixed_s ? step_fixed_s : step_s; }
};

// Models one optimizer step. `config` must be resolved (no "auto" in the batch sizes, buckets and thresholds) and
// at stage 3; `dims` are the model's Llama dimensions (the FLOPs of attention need them); the world is the
// cluster's nodes x gpus_per_node. Throws ConfigError naming the key (a stage other than 3, "auto" left, a layout
// that does not fit the cluster, qwZ/qgZ with fp32 compute), InvalidArgument for a bad option (seq_len below 1).
StepTime model_step_time(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                         const ClusterDesc& cluster, const StepTimeOptions& options);

// The network factors that make DeepSpeed's modelled flow of `config` on `cluster` take `measured_step_s` a step: the
// collective_efficiency of the bandwidth reading (collective_overhead_ms ignored) and the collective_overhead_ms of
// the fixed-cost reading (collective_efficiency taken as 1). A factor is absent when no value meets the measured
// step: collective_efficiency above 1 (the run was faster than the link allows) or an overhead below 0 (faster than
// the link at its NCCL rate). `modelled_*` are the description's own readings of the same step, for its error.
struct NetworkFit {
  double measured_step_s = 0;
  std::optional<double> collective_efficiency;
  std::optional<double> collective_overhead_ms;
  StepTime modelled;  // DeepSpeed's flow with the description's factors
};
NetworkFit fit_network(const ModelDesc& model, const LlamaDims& dims, const Config& config, const ClusterDesc& cluster,
                       const StepTimeOptions& options, double measured_step_s);

// The breakdown of a few runs side by side, one column each with its header, and their time for `steps` steps.
std::string format_step_times(const std::vector<std::string>& headers, const std::vector<StepTime>& columns,
                              int64_t steps);

// One line per run: its name, the node link's bytes per step, the micro-step and what bounds it, the boundary, the
// step and `steps` steps as ranges (low-high), the step's ratio to `baseline`'s (bandwidth readings), and `notes[i]`
// when not empty (e.g. "refused (1)").
std::string format_layout_table(const std::vector<std::string>& names, const std::vector<StepTime>& rows,
                                const StepTime& baseline, int64_t steps, const std::vector<std::string>& notes = {});

// "6.20 s" or "6.20-7.91 s": a step time or a range of them, as the tables print them.
std::string format_seconds_range(double low_s, double high_s);

}  // namespace zero3

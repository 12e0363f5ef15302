// The time of one optimizer step of a ZeRO stage-3 run on a cluster (cluster_desc.hpp), before anything runs:
// from the bytes each rank sends in its collectives (plan_traffic(), traffic_plan.hpp: the engine's own accounting,
// the one ScheduleStats counts and the topology benchmark measures), the bytes each GPU copies to and from host
// memory, the FLOPs of the model, and the optimizer's memory traffic. docs/performance-model.md explains the model, its inputs and their sources, and its
// calibration against a measured DeepSpeed run.
//
// Two data flows of the same config and model:
//   zero3      this engine: gathers and reductions per layout (plain, hpZ, MiCS/HSDP), gradients reduced in
//              Config::communication_dtype() and accumulated on the device in grad_accum_dtype (fp32 by default);
//              with offload_optimizer, the accumulated gradients go down once per optimizer step and, unless the
//              parameter slices live in host memory, the new parameters come up once; with offload_param, each
//              gather from the primary partition first copies the rank's slice up. Optionally ZeRO++'s qwZ and qgZ:
//              the engine does not issue them yet, so their bytes are the model's estimate of ZeRO++'s data flow
//              from the unquantized plan (step_time_model.cpp, estimate_zeropp), and their layout says so.
//   deepspeed  DeepSpeed's plain ZeRO-3 (runtime/zero/stage3.py, partition_parameters.py) of the same config: every
//              gather over all ranks (hpZ and MiCS keys ignored), gradients reduced in communication_dtype(); with
//              offload_param every gather first copies the partition up; with offload_optimizer the gradient
//              partitions live in pinned host memory in the accumulation dtype (the model dtype unless
//              data_types.grad_accum_dtype), and every micro-step copies each reduced partition down and back up
//              (stage3.py partition_grads: accumulate on the device, copy back), and the boundary copies it down
//              once more in fp32 for the optimizer.
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
  // ZeRO++ on the wire (the zero3 flow only): qwZ sends parameter gathers from the primary partition as int8,
  // qgZ reduces gradients with a hierarchical all-to-all of int4 or int8 codes; one fp32 scale per block.
  bool quantized_weights = false;
  int quantized_gradient_bits = 0;  // 0 (off), 4 or 8
  int64_t quantization_block = 2048;
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
  int64_t gpu_intra_bytes = 0;   // the most one rank sends to ranks of its node
  int64_t gpu_h2d_bytes = 0;     // the most one GPU copies from host memory
  int64_t gpu_d2h_bytes = 0;     // the most one GPU copies to host memory

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
};

// Models one optimizer step. `config` must be resolved (no "auto" in the batch sizes, buckets and thresholds) and
// at stage 3; `dims` are the model's Llama dimensions (the FLOPs of attention need them); the world is the
// cluster's nodes x gpus_per_node. Throws ConfigError naming the key (a stage other than 3, "auto" left, a layout
// that does not fit the cluster), InvalidArgument for a bad option (seq_len below 1, quantization outside 0/4/8 bits,
// ZeRO++ asked of the deepspeed flow).
StepTime model_step_time(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                         const ClusterDesc& cluster, const StepTimeOptions& options);

// The breakdown of a few runs side by side, one column each with its header, and their time for `steps` steps.
std::string format_step_times(const std::vector<std::string>& headers, const std::vector<StepTime>& columns,
                              int64_t steps);

// One line per run: its name, the node link's bytes per step, the micro-step and what bounds it, the boundary, the
// step, `steps` steps, and the step's ratio to `baseline`'s.
std::string format_layout_table(const std::vector<std::string>& names, const std::vector<StepTime>& rows,
                                const StepTime& baseline, int64_t steps);

}  // namespace zero3

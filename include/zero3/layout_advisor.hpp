// The layout advisor behind `zero3 plan --advise`: from a user's DeepSpeed config, a model and a cluster description,
// every stage-3 layout zero3 runs, each checked as the engine checks it, planned for memory and timed by the
// step-time model, with the config edits that select it. No trial runs: the memory plan (memory_plan.hpp), the
// traffic plan (traffic_plan.hpp) and the step-time model (step_time_model.hpp) answer at once.
//
// The layouts, on a cluster of N nodes x L GPUs:
//   plain ZeRO-3 over every rank;
//   hpZ with a secondary partition per node (zero_hpz_partition_size L), with 2 nodes or more of 2 GPUs or more;
//   MiCS/HSDP with shard groups of k nodes (mics_shard_size k L) for every k that divides N, k < N, and for k >= 2
//   also with the hierarchical gather (mics_hierarchical_params_gather); for k = N with it only (without it, MiCS
//   over the whole world is plain ZeRO-3);
// each with and without qwZ and qgZ (zero_quantized_weights, zero_quantized_gradients: 4 choices), each with
// offload_optimizer and offload_param none, cpu, or nvme when the user's config names an nvme_path; hpZ also with
// its secondary partition in host memory (zero3.hpz_secondary_memory "host") for a GPU that cannot hold it;
// and pipelined (AdviseOptions::pipelines, pipeline_plan.hpp): S = 2, 4, 8, ... stages dividing the world (at most
// the model's units), stages_across_nodes, schedule 1f1b, and interleaved_1f1b with 2 stages per rank where the
// units allow, with ZeRO stage 1, 2 or 3 over each stage's world / S ranks (plain: no hpZ, MiCS or quantization
// inside a stage), each with the offloads above that the stage allows (parameters at stage 3 only). A pipelined row
// keeps the user's global batch and micro-batch: train_batch_size = micro x accumulation x world / S, so its
// gradient_accumulation_steps are the user's x S (an edit where the config gives a number; a note naming the
// program's --grad-accum where it is "auto"), never another batch; a user batch that S does not divide in this way
// is refused with the numbers. Its note says that the program must split its model (llama3_train
// --pipeline-stages S).
//
// Each candidate's config is the user's JSON with the candidate's edits applied, read and resolved as `zero3 config
// check --world-size N L` reads it (a config the reader refuses is "refused" with its error); then the engine's
// own checks (engine_refusal()); then plan_memory() (pipelined: plan_pipeline(), its worst rank) against the
// cluster's GPU and host memory, the activations included (estimate_activations(), activation_plan.hpp: the figure
// `llama3_train --dry-run` prints for the same config, unless the caller gives its own) and a headroom left free on
// every GPU; then model_step_time() (pipelined: model_pipeline_step_time()). Refused
// layouts and those that do not fit are never ranked; the others are ranked by the high end of their predicted step
// range (the slower of the step-time model's two readings of the network), then the low end, then the fewer edits,
// then the less GPU memory. Each row also carries its rank under each reading alone.
//
// zero3 runs layouts DeepSpeed refuses or quietly changes; each such row carries the difference and where in
// DeepSpeed it comes from (deepspeed_differences()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero3/activation_plan.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/step_time_model.hpp"

namespace zero3 {

// One edit of the user's DeepSpeed JSON: set the key at `path` (dotted, e.g. "zero_optimization.offload_param") to
// the JSON text `value`, or remove it when `value` is empty.
struct ConfigEdit {
  std::string path;
  std::optional<std::string> value;
  // "zero_optimization.zero_hpz_partition_size: 4", "zero_optimization.offload_param: removed"
  std::string text() const;
  friend bool operator==(const ConfigEdit&, const ConfigEdit&) = default;
};

// The DeepSpeed JSON text `json_text` (comments and trailing commas as the config reader accepts them) with the
// edits applied in order, pretty-printed (comments do not survive). Setting a key creates the objects on its path;
// removing one that is absent changes nothing. Throws ConfigError naming `source` for text the reader refuses, or
// a path through something that is not an object.
std::string apply_config_edits(const std::string& json_text, const std::vector<ConfigEdit>& edits,
                               const std::string& source);

// Why the engine would refuse `config` (resolved) on `cluster`'s GPUs (nodes x gpus_per_node ranks, ranks numbered
// node by node), or "" when it would take it: the engine's own checks, called, not restated: the resolved batch
// for the world (detail::require_resolved), the layout keys (config_detail::check_layouts,
// check_quantization_precision) and the groups against the nodes (detail::make_shard_layout). A pipelined config
// (pipeline.stages > 1) is checked as the pipeline engine makes each stage's Engine: the batch for the stage's
// data-parallel group, the groups against that group's share of the nodes.
std::string engine_refusal(const Config& config, const ClusterDesc& cluster);

// A candidate layout: the keys it sets.
struct LayoutChoice {
  int64_t hpz_partition_size = 1;  // > 1: hpZ
  int64_t mics_shard_size = -1;    // > 0: MiCS
  bool hierarchical = false;
  bool qwz = false;
  bool qgz = false;
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;
  bool secondary_on_host = false;  // hpZ: zero3.hpz_secondary_memory "host"
  // Pipelined (pipeline_plan.hpp): pipeline.stages > 1, its schedule and virtual stages, and the ZeRO stage inside.
  int64_t pipeline_stages = 1;
  std::string pipeline_schedule = "1f1b";
  int64_t virtual_stages = 1;
  std::string stage_order = "stages_across_nodes";
  int zero_stage = 3;

  // "hpZ, one node + qwZ + qgZ" (groups named in nodes of `gpus_per_node`), "pipeline 4 x 1f1b, ZeRO-1, one node"
  // (the stage's data-parallel group among `world` ranks), and describe() with the offloads:
  // "hpZ, one node + qwZ + qgZ; offload optimizer cpu, parameters none".
  std::string layout(int64_t gpus_per_node, int64_t world = 0) const;
  std::string describe(int64_t gpus_per_node, int64_t world = 0) const;
  friend bool operator==(const LayoutChoice&, const LayoutChoice&) = default;
};

// What DeepSpeed (the version read: microsoft/DeepSpeed, 2025-02) does with a layout that zero3 runs as configured.
struct DeepSpeedDifference {
  bool refuses = false;  // DeepSpeed stops (an error); otherwise it runs something other than the config says
  std::string what;      // "refuses MiCS with replicas and offload_optimizer"
  std::string where;     // "runtime/zero/mics.py, MiCS_Optimizer.allreduce_mics_shard_grads: ..."
  friend bool operator==(const DeepSpeedDifference&, const DeepSpeedDifference&) = default;
};

// The differences for `choice` on a world of `world` ranks; empty when DeepSpeed runs it as zero3 does.
std::vector<DeepSpeedDifference> deepspeed_differences(const LayoutChoice& choice, int64_t world);

enum class Verdict { ranked, does_not_fit, refused };

struct AdvisedLayout {
  LayoutChoice choice;
  std::vector<ConfigEdit> edits;  // relative to the user's config: what selects this layout
  Verdict verdict = Verdict::refused;
  std::string reason;           // refused: the reader's or the engine's error; does_not_fit: the limit exceeded
  bool is_user_config = false;  // the user's config as it is (no edits)
  int64_t gpu_bytes = 0;        // the memory plan per GPU (activations included); 0 when refused
  int64_t host_node_bytes = 0;  // per node, host memory; 0 when refused
  int64_t nvme_node_bytes = 0;  // per node, NVMe (not checked: the cluster description has no NVMe capacity)
  int64_t gpu_free_bytes = 0;   // what the GPU's plan leaves of Advice::gpu_plan_bytes (negative: over it)
  StepTime time;                // zero3's flow; ranked layouts only
  size_t rank_bandwidth = 0;    // ranked: 1-based rank by the bandwidth reading alone (StepTime::step_s)
  size_t rank_fixed_cost = 0;   // ranked: by the fixed-cost reading alone (StepTime::step_fixed_s)
  std::vector<DeepSpeedDifference> deepspeed;  // what DeepSpeed refuses or changes in this layout
  std::string note;   // what the row needs besides its edits (a pipelined row: the program's split and batch flags)
  double bubble = 0;  // a pipelined row: its schedule's bubble_fraction()
  Config config;      // the edited config, resolved (refused by the reader: the user's)
};

inline constexpr int64_t kDefaultGpuHeadroomBytes = int64_t{1} << 30;

struct AdviseOptions {
  int64_t seq_len = 0;  // tokens per sequence, >= 1
  // Per GPU, on the device: the caller's figure (e.g. `zero3 plan --activation-bytes`); absent: estimated from the
  // model, the micro-batch, seq_len and `checkpointing` as the Llama-3 example's kernels hold them.
  std::optional<int64_t> activation_bytes;
  bool checkpointing = true;  // activation checkpointing per layer (llama3_train's default)
  // What every GPU must keep free beyond its plan and the cluster's gpu_reserved_gib for a layout to fit: the margin
  // for what the estimates miss (allocator fragmentation, buffers outside the plan). >= 0.
  int64_t gpu_headroom_bytes = kDefaultGpuHeadroomBytes;
  ResolveInputs inputs;   // what resolves the config's "auto" (batch, hidden size); the world is the cluster's
  bool pipelines = true;  // rank pipelined layouts too
};

// Which reading of the network decides the first row, when a reading alone would put another layout first.
struct ReadingsNote {
  size_t bandwidth_first = 0;   // index in Advice::ranked of the first row by the bandwidth reading alone
  size_t fixed_cost_first = 0;  // by the fixed-cost reading alone
  // The cost per cross-node collective above which the ranking's first row stops being bandwidth_first's layout,
  // found by re-timing every ranked row between 0 and the description's collective_overhead_ms; absent when
  // bandwidth_first leads at every cost in that range or the range has no fixed cost.
  std::optional<double> crossover_overhead_ms;
};

struct Advice {
  std::string config_source;
  int64_t gpu_plan_bytes = 0;   // what a GPU's plan may use (ClusterDesc::gpu_plan_bytes)
  int64_t host_plan_bytes = 0;  // what a node's host memory may hold
  int64_t gpu_headroom_bytes = 0;
  int64_t micro_batch = 0;  // the user's config's, resolved
  int64_t seq_len = 0;
  int64_t activation_bytes = 0;
  bool activations_estimated = false;      // from estimate_activations(), not the caller
  bool checkpointing = true;               // the estimate's activation checkpointing
  ActivationEstimate activations;          // the estimate's parts (estimated only)
  std::vector<AdvisedLayout> ranked;       // fitting and accepted, fastest first
  std::vector<AdvisedLayout> not_fitting;  // accepted by the engine, over a memory limit
  std::vector<AdvisedLayout> refused;      // by the config reader or the engine
  std::optional<size_t> user_config_rank;  // the user's own config's index in `ranked`, when it is there
  std::optional<ReadingsNote> readings;    // a reading alone puts another layout first
};

// Enumerates, checks, plans and ranks every layout for the user's config text `config_json` (read from
// `config_source`). Throws ConfigError naming the file and key: the user's config unreadable or not resolvable for
// the cluster's world, not stage 3, or the cluster description without gpu_memory_gib or host_memory_gib;
// InvalidArgument for a seq_len below 1, a negative activation_bytes or headroom, or a model without the Llama
// dimensions the activations and FLOPs need.
Advice advise_layouts(const std::string& config_json, const std::string& config_source, const ModelDesc& model,
                      const LlamaDims& dims, const ClusterDesc& cluster, const AdviseOptions& options);

// The ranking (at most `top` rows; 0: all), each row with its edits, its rank under each reading and what DeepSpeed
// refuses or changes in it, then the layouts that do not fit and those refused, with their reasons; step times for
// `steps` steps beside each step.
std::string format_advice(const Advice& advice, const ClusterDesc& cluster, int64_t steps, size_t top = 0);

}  // namespace zero3

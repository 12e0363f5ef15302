// The plans of a pipelined run (pipeline.stages S > 1, docs/pipeline.md): what each pipeline rank holds, what it
// sends, and how long a step takes, from shapes and the config alone, as the unpipelined plans (memory_plan.hpp,
// traffic_plan.hpp, step_time_model.hpp) do for one engine over the whole world. `zero3 plan` prints them for a
// pipelined config, and `zero3 plan --advise` ranks pipelined layouts with them beside the others.
//
// The layout (pipeline_engine.hpp fixes it): the model's units are the pipeline's layers, cut into S x v (virtual)
// stages by pipeline.partition (v = zero3.pipeline_virtual_stages); pipeline rank r holds stages r, r + S, ...; the
// world's ranks are S pipeline ranks x D = world / S data-parallel ranks, placed by zero3.pipeline_stage_order. Each
// pipeline rank's units run under the config's ZeRO stage over its data-parallel group of D ranks, with
// gradient_accumulation_steps = m micro-batches per optimizer step, which follow zero3.pipeline_schedule.
//
// Memory, per pipeline rank: plan_memory() of its units over D ranks (the group's ranks per node as the stage order
// places them), plus the activations the schedule keeps in flight. The schedule is walked action by action: a
// micro-batch's activations on a stage are held from its forward to its backward, and the most held at once is the
// rank's worst moment (1F1B: at most S - r micro-batches on rank r; GPipe: all m). Per micro-batch held on a stage
// of l decoder layers: its residual streams, l (l + 1 on the first stage, which makes its own input) x n x hidden,
// and without activation checkpointing the l layers' caches (estimate_activations(), activation_plan.hpp, scaled
// from the whole model's L layers to the stage's l); and the activation it received (not on the first stage),
// boundary_numel elements, held by the pipeline engine until that backward. Once per rank: the layer workspace and
// attention scratch, one layer's cache with checkpointing, the loss chunk on the rank that holds the head, the unit
// staging, and two boundary buffers in flight (the outgoing activation, a gradient). The rank that holds the most
// device memory decides whether a layout fits.
//
// Traffic, per optimizer step: every stage boundary carries m x boundary_numel elements of activation_dtype forward
// and as many gradient elements backward, between the ranks of the two stages with the same data-parallel index;
// it crosses between nodes when those ranks are on different nodes (stages_across_nodes with a node per stage:
// every boundary). Each pipeline rank's ZeRO traffic is plan_traffic() of its units over its data-parallel group,
// within a node when the group fits one.
//
// Time: a schedule step of rank r (one micro-batch through its stages, forward and backward) takes the busiest of
// its compute, its group's ZeRO traffic on the node links it shares (the micro-step's share), its intra-node ZeRO
// traffic and its PCIe copies, as the unpipelined model's micro-step does, plus its boundary transfers, which run
// between its computations (the schedule's send_recv calls) and are not overlapped. The slowest rank's step sets the
// pace: the pipeline takes m x step / (1 - bubble), with the schedule's bubble_fraction() ((S - 1) / (m + S - 1) for
// GPipe and 1F1B, less interleaved). Then the optimizer boundary of the slowest rank (its group's boundary
// collectives, Adam, the step's copies). The two readings of the network as in step_time_model.hpp: the boundary
// transfers at inter_node_gb_s(), or at nccl_link_gb_s() plus collective_overhead_ms per send_recv call that
// crosses nodes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero3/activation_plan.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/pipeline_schedule.hpp"
#include "zero3/step_time_model.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3 {

struct PipelinePlanOptions {
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;  // must divide world_size
  // Elements of one micro-batch's activation at every stage boundary (a Llama: micro-batch x seq x hidden), and
  // their dtype on the wire (PipelineOptions::activation_dtype of the program; the compute dtype by default).
  int64_t boundary_numel = 0;
  std::optional<DType> activation_dtype;
  // A Llama's dimensions and the whole model's activations per micro-batch (estimate_activations()): the plan scales
  // them to each rank's layers. Without them (a unit list) only the boundary buffers are counted.
  std::optional<LlamaDims> dims;
  std::optional<ActivationEstimate> activations;
  bool checkpointing = true;  // the estimate's activation checkpointing
};

// One pipeline rank: every world rank with this pipeline rank holds the same (its data-parallel group's slices).
struct PipelineRankPlan {
  int rank = 0;                           // pipeline rank (position in its pipeline group)
  std::vector<int> stages;                // its (virtual) stages, ascending
  std::vector<int64_t> world_ranks;       // the world ranks that hold it, by data-parallel index
  ModelDesc units;                        // their units, in forward order
  int64_t decoder_layers = 0;             // of them, a Llama's decoder layers (with dims)
  bool first = false;                     // holds the first stage (the embedding)
  bool last = false;                      // holds the last stage (the head and the loss)
  int in_flight = 0;                      // most (micro-batch, stage) pairs held at once between forward and backward
  int64_t held_activation_bytes = 0;      // the activations at that moment: residual streams, caches, received inputs
  int64_t once_activation_bytes = 0;      // what it holds once: workspace, attention, loss chunk, staging, 2 buffers
  MemoryPlan memory;                      // its units over its data-parallel group, the activations included
  TrafficPlan traffic;                    // its data-parallel group's ZeRO traffic per optimizer step
  int64_t boundary_sent_bytes = 0;        // per optimizer step, per world rank: activations and gradients sent on
  int64_t boundary_inter_node_bytes = 0;  // of them, the most a world rank of this pipeline rank sends off its node
  int boundary_inter_node_calls = 0;      // its send_recv calls per step with a transfer that crosses nodes (the most)
};

struct PipelinePlan {
  pipeline::Schedule schedule;  // the config's schedule (ranks S, micro-batches m, stages per rank v)
  std::string stage_order;      // zero3.pipeline_stage_order
  int64_t world_size = 1, ranks_per_node = 1, nodes = 1;
  int64_t data_parallel = 1;         // D = world / S
  int64_t group_ranks_per_node = 1;  // a data-parallel group's ranks on each node it spans
  std::vector<int> bounds;           // S x v + 1 unit indices: stage s holds units [bounds[s], bounds[s + 1])
  std::string partition;             // describe_partition(): each stage's units and parameters
  double bubble = 0;                 // bubble_fraction(schedule)
  int64_t boundary_numel = 0;
  DType activation_dtype = DType::bf16;
  int64_t boundary_bytes_per_step = 0;  // each way, per stage boundary and data-parallel index: m x numel x dtype
  std::vector<PipelineRankPlan> ranks;  // by pipeline rank
  std::vector<int64_t> node_inter_node_bytes;  // per node, per optimizer step: boundary transfers + ZeRO, sent off
  std::vector<int64_t> node_boundary_inter_node_bytes;  // of them, the boundary transfers
  std::vector<int64_t> node_host_bytes;                 // per node: host memory of its ranks (device tier too on cpu)

  size_t worst_rank() const;  // the pipeline rank with the most device bytes (the first of equals)
  int64_t max_node_inter_node_bytes() const;
};

// Plans `model` (its units are the pipeline's layers) under a resolved `config` with pipeline.stages >= 1. Throws
// ConfigError naming the key and the numbers: more (virtual) stages than units (pipeline.stages), a partition that
// matches no unit (pipeline.partition), a stage count that does not divide the world or a schedule that needs more
// micro-batches (as resolve() and the pipeline engine refuse them), a data-parallel group the stage order spreads
// unevenly over the nodes (zero3.pipeline_stage_order); InvalidArgument for a world or node size below 1, a
// negative boundary_numel, dims that do not match the model's units (embedding, L layers, head), tied embeddings
// split across stages, or the plan_memory()/plan_traffic() arguments they refuse.
PipelinePlan plan_pipeline(const ModelDesc& model, const Config& config, const PipelinePlanOptions& options);

// The pipeline's shape, then a table per pipeline rank (stages, units, in-flight micro-batches, device and host
// bytes, ZeRO and boundary bytes per step), then per node the bytes sent to other nodes.
std::string format_pipeline_plan(const PipelinePlan& plan);

struct PipelineStepTime {
  // The summary the advisor ranks, as for an unpipelined step: step_s and step_fixed_s, micro_step_s (the slowest
  // rank's schedule step), bound and the bytes of the busiest node and GPU; grad_accum is m.
  StepTime time;
  double bubble = 0;
  size_t slowest_rank = 0;      // the pipeline rank whose schedule step sets the pace (bandwidth reading)
  std::vector<StepTime> ranks;  // each pipeline rank's schedule step (micro_step_s: without its transfers)
  std::vector<double> transfer_s, transfer_fixed_s;  // each rank's boundary transfers per schedule step
  double pipeline_s = 0, pipeline_fixed_s = 0;       // m x the slowest step / (1 - bubble)
};

// Models one optimizer step of a pipelined `config` (resolved, pipeline.stages >= 1, ZeRO stage 1-3 inside the
// stages) on `cluster`, zero3's flow. `options.seq_len` and the model's Llama dimensions as model_step_time() needs
// them; boundary_numel is micro-batch x seq x hidden, in the config's compute dtype. Throws as plan_pipeline() and
// model_step_time() do (the step-time model's stage-3 rule excepted: stages 1-3 are modelled).
PipelineStepTime model_pipeline_step_time(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                                          const ClusterDesc& cluster, const StepTimeOptions& options);

// The breakdown: the bubble, each rank's schedule step (compute, ZeRO, transfers), the pipeline, the boundary and
// the step under both readings, and `steps` steps.
std::string format_pipeline_step_time(const PipelineStepTime& time, int64_t steps);

}  // namespace zero3

// The bytes the engine's collectives send, per rank, split by whether they stay on the node or cross to another:
// counted by the engine as it runs (ScheduleStats), and predicted per optimizer step from shapes and the config by
// plan_traffic(), which `zero3 plan` prints, so that a run, a benchmark and a performance model count alike.
//
// The model of a collective is a ring, as NCCL's and Gloo's are: over a group of g ranks, in the group's rank
// order, each rank sends only to the next rank of the group, and per collective it sends
//   all_gather of n elements per rank:      (g - 1) * n elements
//   reduce_scatter of n elements per rank:  (g - 1) * n
//   all_reduce of n elements:               floor(2 (g - 1) n / g)
// times the element size of the dtype on the wire. The bytes count as inter-node when the next rank of the group
// lies on another node, else as intra-node; summed over a node's ranks, the inter-node bytes are what the node's
// link carries (up to the transports' framing). A collective counts as inter-node when its group spans nodes.
// The engine counts its parameter gathers and gradient reductions this way (ScheduleStats::gather_traffic,
// ScheduleStats::reduce_traffic); the small collectives that check and agree (orders, Inf/NaN, norms) are not
// counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero3/config.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3 {

struct CollectiveTraffic {
  int64_t collectives = 0;             // issued by this rank
  int64_t inter_node_collectives = 0;  // of which over a group that spans nodes
  int64_t intra_node_bytes = 0;        // sent to the next rank of a group on this rank's node
  int64_t inter_node_bytes = 0;        // sent to the next rank of a group on another node

  CollectiveTraffic& operator+=(const CollectiveTraffic& o) {
    collectives += o.collectives;
    inter_node_collectives += o.inter_node_collectives;
    intra_node_bytes += o.intra_node_bytes;
    inter_node_bytes += o.inter_node_bytes;
    return *this;
  }
  friend CollectiveTraffic operator-(CollectiveTraffic a, const CollectiveTraffic& b) {
    a.collectives -= b.collectives;
    a.inter_node_collectives -= b.inter_node_collectives;
    a.intra_node_bytes -= b.intra_node_bytes;
    a.inter_node_bytes -= b.inter_node_bytes;
    return a;
  }
  friend bool operator==(const CollectiveTraffic&, const CollectiveTraffic&) = default;
};

// One rank's traffic in one optimizer step.
struct RankTraffic {
  CollectiveTraffic gathers;     // parameter all-gathers (ScheduleStats::gather_traffic)
  CollectiveTraffic reductions;  // gradient reductions (ScheduleStats::reduce_traffic)

  // Parts of the two that a model of the step's time (step_time_model.hpp) needs apart; already counted above.
  CollectiveTraffic boundary_gathers;     // once per optimizer step, after it: persistent units' re-gathers (stage 3),
                                          // every unit's gather (stage 1-2)
  CollectiveTraffic boundary_reductions;  // once per optimizer step, at the boundary: MiCS's all-reduce across
                                          // replicas (stage 2-3), the gradients' all-reduce (stage 0-1)
  CollectiveTraffic secondary_gathers;    // hpZ's gathers from the secondary partition (the others read the primary)
  int64_t primary_gather_elements = 0;    // elements of this rank's own slices that its gathers from the primary
                                          // partition send: what offload_param copies to the device before them
  int64_t secondary_fill_elements = 0;    // hpZ: elements of this rank's secondary chunks, written once per step
  int64_t secondary_gather_elements = 0;  // hpZ: elements of this rank's secondary chunks its gathers from the
                                          // secondary partition send (zero3.hpz_secondary_memory "host" copies
                                          // them to the device before each)
};

struct TrafficPlanOptions {
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;  // must divide world_size
  // Within an accumulation window the engine keeps the next micro-step's first units gathered from their last use
  // (docs/gpu.md, "Prefetch across the micro-step boundary"); false plans a flow that gathers them again (DeepSpeed).
  bool keep_first_units = true;
};

// What the engine sends in one optimizer step of the steady state (the order of units recorded, as from the second
// micro-step on; the first micro-step of a run gathers every unit on demand, and the first step after materialize()
// has no persistent units to re-gather). The micro-step is the memory plan's: every unit's forward scope in
// declaration order, then its backward scopes in reverse, with the config's prefetch, reuse and live-parameter rules
// deciding how often each unit is gathered (include/zero3/memory_plan.hpp); each micro-step of the window but its
// last keeps the next one's first units still gathered at its end (keep_first_units), one gather less for each in
// the next micro-step. Per optimizer step, with a =
// gradient_accumulation_steps, W the partition's ranks (the world, or mics_shard_size), S_u = ceil(P_u / W):
//   stage 3, every non-persistent unit, each of its gathers: an all_gather of S_u compute-dtype elements per rank
//     over the partition's group; MiCS's hierarchical gather: one over the shard group's nodes (S_u) and then one
//     per such node within the node (S_u each); hpZ: the first gather of the step over every rank (S_u), the
//     others within the hpZ group from the secondary partition (Pp_u / H); persistent units: one gather after the step;
//   stage 2-3: every micro-step, reduce_scatter of the gradient slices over the partition's group, in buckets of
//     min(reduce_bucket_size / W, sum of S_u) elements in communication_data_type; MiCS with replicas: at the
//     boundary, all_reduce of the slices across the replicas in buckets of min(reduce_bucket_size, sum of S_u);
//   stage 0-1: at the boundary, all_reduce of the gradients in buckets of min(reduce_bucket_size, sum of P_u);
//   stage 1-2: after the step, an all_gather of every unit's slices.
// ZeRO++ (stage 3, docs/quantization.md): with zero_quantized_weights every gather above of a non-persistent unit
// over two or more ranks moves quant_message_bytes(n, {8, zero3.qwz_block_size}) bytes per rank instead of n
// elements (counted as fp32 words); with zero_quantized_gradients each bucket of f elements per rank is reduced by
// an all-to-all within the node of quant_message_bytes(N f, {4, zero3.qgz_block_size}) bytes per peer and one across
// the N nodes of quant_message_bytes(f, ...) bytes per peer (ShardLayout::qgz_*_group), instead of the reduce_scatter.
struct TrafficPlan {
  std::string layout;  // "ZeRO-3 over 8 ranks", "MiCS: shard groups of 2 ranks (one node: HSDP) x 4 replicas", ...
  int64_t world_size = 1;
  int64_t ranks_per_node = 1;
  int64_t nodes = 1;
  int64_t gradient_accumulation_steps = 1;
  int64_t slice_elements = 0;      // elements of one rank's slices over all units (padded): its gradient partition
  std::vector<RankTraffic> ranks;  // by rank

  // The bytes node `node`'s ranks send to other nodes: what its link carries out, per optimizer step.
  int64_t node_inter_node_bytes(int64_t node) const;
  // The most any node sends to other nodes.
  int64_t max_node_inter_node_bytes() const;
};

// Plans `model` under a resolved `config` (ConfigError for "auto" left in the fields used, or groups that do not fit
// the nodes; InvalidArgument for a world or node size < 1, nodes that do not divide the world, or an empty model).
TrafficPlan plan_traffic(const ModelDesc& model, const Config& config, const TrafficPlanOptions& options);

// A table: per node, the bytes its ranks send within the node and to other nodes per optimizer step, for gathers and
// reductions, and the collectives that cross nodes.
std::string format_traffic_plan(const TrafficPlan& plan);

}  // namespace zero3

#include "zero/step_traffic.hpp"

#include <algorithm>
#include <vector>

#include "core/check.hpp"
#include "zero/gather_replay.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace zero3::detail {
namespace {

int64_t require_resolved(const std::optional<int64_t>& v, const char* key) {
  ZERO3_REQUIRE(v.has_value(), ConfigError, "zero_optimization.", key,
                ": still \"auto\"; resolve the config first (zero3 plan: --hidden-size, or a Llama config.json)");
  return *v;
}

// Pours `sizes` (in order) into buckets of `chunk` elements and calls `launch(fill)` for each bucket, as the
// reducer does: a bucket is sent when full, the last one when the pouring ends.
template <typename F>
void pour(const std::vector<int64_t>& sizes, int64_t chunk, F launch) {
  int64_t fill = 0;
  for (int64_t s : sizes) {
    while (s > 0) {
      const int64_t take = std::min(s, chunk - fill);
      fill += take;
      s -= take;
      if (fill == chunk) {
        launch(fill);
        fill = 0;
      }
    }
  }
  if (fill > 0) launch(fill);
}

// An all-to-all over `group` from `rank`: `bytes_per_peer` to every other member, intra- or inter-node by the
// member's node.
void count_all_to_all(CollectiveTraffic& t, const RankGroup& group, const NodeLayout& nodes, int rank,
                      int64_t bytes_per_peer) {
  t.collectives++;
  if (group.spans_nodes(nodes)) t.inter_node_collectives++;
  for (int peer : group.ranks) {
    if (peer == rank) continue;
    (nodes.node_of(peer) == nodes.node_of(rank) ? t.intra_node_bytes : t.inter_node_bytes) += bytes_per_peer;
  }
}

}  // namespace

int64_t wire_bytes(int64_t n, int64_t element_bytes, const WireQuant& q) {
  if (q.bits == 0) return n * element_bytes;
  const int64_t codes = (n * q.bits + 7) / 8;
  return (codes + 3) / 4 * 4 + 4 * ((n + q.block - 1) / q.block);
}

CollectiveTraffic StepTraffic::total() const {
  CollectiveTraffic t = forward_gathers;
  t += backward_gathers;
  t += reductions;
  t += boundary;
  return t;
}

StepTraffic plan_step_traffic(const ModelDesc& model, const Config& config, const ShardLayout& layout, int rank,
                              const StepTrafficOptions& options) {
  const ZeroConfig& z = config.zero;
  ZERO3_REQUIRE(z.stage == 3, ConfigError, "zero_optimization.stage: ", z.stage,
                "; the traffic plan covers stage 3 (parameters gathered every micro-step)");
  ZERO3_REQUIRE(!model.units.empty(), InvalidArgument, "plan_step_traffic: model '", model.name, "' has no units");
  ZERO3_REQUIRE(rank >= 0 && rank < layout.nodes.world, InvalidArgument, "plan_step_traffic: rank ", rank,
                " is not a rank of ", layout.nodes.describe());
  ZERO3_REQUIRE(options.grad_accum >= 1, InvalidArgument, "plan_step_traffic: grad_accum ", options.grad_accum,
                " must be >= 1");
  ZERO3_REQUIRE(options.weights.bits == 0 || options.weights.bits == 8, InvalidArgument,
                "plan_step_traffic: quantized weights have ", options.weights.bits,
                " bits; qwZ sends int8 (8) or 0 (off)");
  ZERO3_REQUIRE(options.gradients.bits == 0 || options.gradients.bits == 4 || options.gradients.bits == 8,
                InvalidArgument, "plan_step_traffic: quantized gradients have ", options.gradients.bits,
                " bits; qgZ sends int4 (4) or int8 (8), or 0 (off)");
  ZERO3_REQUIRE(options.weights.block >= 1 && options.gradients.block >= 1, InvalidArgument,
                "plan_step_traffic: a quantization block of ", std::min(options.weights.block, options.gradients.block),
                " elements; expected at least 1");
  const int64_t prefetch = require_resolved(z.prefetch_bucket_size, "stage3_prefetch_bucket_size");
  const int64_t persistence = require_resolved(z.param_persistence_threshold, "stage3_param_persistence_threshold");
  const int64_t bucket = require_resolved(z.reduce_bucket_size, "reduce_bucket_size");
  ZERO3_REQUIRE(bucket >= 1, ConfigError, "zero_optimization.reduce_bucket_size: ", bucket,
                " is not a positive number of elements");

  const NodeLayout& nodes = layout.nodes;
  const int G = layout.shard_size;
  const int64_t c = static_cast<int64_t>(dtype_size(config.compute_dtype()));
  const int64_t g = static_cast<int64_t>(dtype_size(config.communication_dtype()));
  const int ga = options.grad_accum;

  std::vector<ReplayUnit> units;
  std::vector<int64_t> slices;
  for (const UnitDesc& u : model.units) {
    const int64_t p = u.numel();
    ZERO3_REQUIRE(p > 0, InvalidArgument, "plan_step_traffic: unit '", u.name, "' has no elements");
    const int64_t s = (p + G - 1) / G;
    units.push_back({p, s * G, false});
    slices.push_back(s);
  }
  mark_persistent(units, persistence, z.model_persistence_threshold);
  const GatherReplay replay = replay_micro_step(units, prefetch, z.max_live_parameters, z.max_reuse_distance);

  StepTraffic out;
  for (int64_t s : slices) out.owned_elements += s;

  const GroupLink shard = link_of(layout.shard_group(rank), nodes, rank);
  // A gather from the primary partition of a unit with slices of `s` elements.
  auto primary_gather = [&](CollectiveTraffic& t, int64_t s) {
    out.primary_slice_elements += s;
    const int64_t n = wire_bytes(s, c, options.weights);
    const int64_t es = options.weights.bits == 0 ? c : 1;
    const int64_t count = options.weights.bits == 0 ? s : n;
    if (layout.hierarchical) {
      count_collective(t, link_of(layout.shard_inter_node_group(rank), nodes, rank), CollectiveKind::all_gather, count,
                       es);
      const GroupLink intra = link_of(layout.shard_intra_node_group(rank), nodes, rank);
      for (int j = 0; j < G / nodes.ranks_per_node; ++j)
        count_collective(t, intra, CollectiveKind::all_gather, count, es);
    } else {
      count_collective(t, shard, CollectiveKind::all_gather, count, es);
    }
  };
  const bool hpz = layout.kind == LayoutKind::hpz;
  const GroupLink hpz_link = link_of(layout.hpz_group(rank), nodes, rank);

  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].persistent) {
      primary_gather(out.boundary, slices[i]);  // re-gathered after every optimizer step
      continue;
    }
    bool secondary_valid = false;  // hpZ: the first gather after the optimizer step fills the secondary partition
    for (int m = 0; m < ga; ++m) {
      for (int phase = 0; phase < 2; ++phase) {
        CollectiveTraffic& t = phase == 0 ? out.forward_gathers : out.backward_gathers;
        const int n = phase == 0 ? replay.forward_gathers[i] : replay.backward_gathers[i];
        for (int k = 0; k < n; ++k) {
          if (hpz && secondary_valid) {
            count_collective(t, hpz_link, CollectiveKind::all_gather, units[i].padded / layout.hpz_size, c);
          } else {
            primary_gather(t, slices[i]);
            secondary_valid = hpz;
          }
        }
      }
    }
  }

  // Gradient reductions, every micro-step; the reducer sees the units in backward order.
  std::vector<int64_t> backward_slices(slices.rbegin(), slices.rend());
  if (options.gradients.bits == 0) {
    const int64_t chunk = std::max<int64_t>(1, std::min(std::max<int64_t>(1, bucket / G), out.owned_elements));
    for (int m = 0; m < ga; ++m) {
      pour(backward_slices, chunk,
           [&](int64_t fill) { count_collective(out.reductions, shard, CollectiveKind::reduce_scatter, fill, g); });
    }
  } else {
    const int per_node = std::min(G, nodes.ranks_per_node);  // L': the shard group's ranks on one node
    const int group_nodes = G / per_node;                    // N'
    const RankGroup intra = G <= nodes.ranks_per_node ? layout.shard_group(rank) : layout.intra_node_group(rank);
    for (int m = 0; m < ga; ++m) {
      for (auto it = slices.rbegin(); it != slices.rend(); ++it) {
        const int64_t s = *it;
        if (per_node > 1) {
          count_all_to_all(out.reductions, intra, nodes, rank, wire_bytes(s * group_nodes, g, options.gradients));
        }
        if (group_nodes > 1) {
          count_all_to_all(out.reductions, layout.shard_inter_node_group(rank), nodes, rank,
                           wire_bytes(s, g, options.gradients));
        }
      }
    }
  }

  // MiCS: the replicas' sums, once per optimizer step, in declaration order.
  if (layout.replicas() > 1) {
    const GroupLink replica = link_of(layout.replica_group(rank), nodes, rank);
    const int64_t chunk = std::max<int64_t>(1, std::min(bucket, out.owned_elements));
    pour(slices, chunk,
         [&](int64_t fill) { count_collective(out.boundary, replica, CollectiveKind::all_reduce, fill, g); });
  }
  return out;
}

}  // namespace zero3::detail

#include "zero3/traffic_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <utility>

#include "core/check.hpp"
#include "kernels/block_quantize.hpp"
#include "plan/gather_simulation.hpp"
#include "plan/plan_format.hpp"
#include "zero/topology.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

using detail::CollectiveKind;
using detail::count_collective;
using detail::GroupLink;
using detail::with_commas;

// `total` elements through a reducer whose buckets hold `chunk`: full buckets, then the rest (as Reducer packs them).
void count_buckets(CollectiveTraffic& t, const GroupLink& link, CollectiveKind kind, int64_t total, int64_t chunk,
                   int64_t element_bytes) {
  for (int64_t i = 0; i < total / chunk; ++i) count_collective(t, link, kind, chunk, element_bytes);
  if (total % chunk != 0) count_collective(t, link, kind, total % chunk, element_bytes);
}

int64_t accumulation_steps(const Config& c, int64_t world) {
  if (c.gradient_accumulation_steps) return *c.gradient_accumulation_steps;
  if (c.train_batch_size && c.train_micro_batch_size_per_gpu && *c.train_micro_batch_size_per_gpu * world > 0) {
    return *c.train_batch_size / (*c.train_micro_batch_size_per_gpu * world);
  }
  return 1;
}

}  // namespace

int64_t TrafficPlan::node_inter_node_bytes(int64_t node) const {
  int64_t total = 0;
  for (int64_t r = node * ranks_per_node; r < (node + 1) * ranks_per_node; ++r) {
    const RankTraffic& t = ranks[static_cast<size_t>(r)];
    total += t.gathers.inter_node_bytes + t.reductions.inter_node_bytes;
  }
  return total;
}

int64_t TrafficPlan::max_node_inter_node_bytes() const {
  int64_t most = 0;
  for (int64_t n = 0; n < nodes; ++n) most = std::max(most, node_inter_node_bytes(n));
  return most;
}

TrafficPlan plan_traffic(const ModelDesc& model, const Config& config, const TrafficPlanOptions& options) {
  ZERO3_REQUIRE(
      options.world_size >= 1 && options.ranks_per_node >= 1 && options.world_size % options.ranks_per_node == 0,
      InvalidArgument, "plan_traffic: ", options.ranks_per_node, " ranks per node do not tile a world of ",
      options.world_size);
  ZERO3_REQUIRE(!model.units.empty(), InvalidArgument, "plan_traffic: model '", model.name, "' has no units");
  const ZeroConfig& z = config.zero;
  ZERO3_REQUIRE(z.reduce_bucket_size.has_value(), ConfigError,
                "zero_optimization.reduce_bucket_size: still \"auto\"; resolve the config (zero3 plan --hidden-size)");
  const detail::ShardLayout layout = detail::plan_layout(z, options.world_size, options.ranks_per_node);
  const detail::NodeLayout nodes = detail::make_node_layout(static_cast<int>(options.world_size),
                                                            static_cast<int>(options.ranks_per_node), "ranks per node");

  TrafficPlan plan;
  plan.layout = layout.describe();
  plan.world_size = options.world_size;
  plan.ranks_per_node = options.ranks_per_node;
  plan.nodes = nodes.nodes();
  const int64_t a = accumulation_steps(config, options.world_size);
  ZERO3_REQUIRE(a >= 1, ConfigError, "gradient_accumulation_steps: ", a, " is not a positive integer");
  plan.gradient_accumulation_steps = a;

  const int64_t w = layout.shard_size;
  const int64_t c = static_cast<int64_t>(dtype_size(config.compute_dtype()));
  const int64_t cb = static_cast<int64_t>(dtype_size(config.communication_dtype()));
  const QuantFormat weights{8, config.zero3.qwz_block_size};
  std::vector<detail::SimulatedUnit> units;
  int64_t total_slice = 0, total_numel = 0;
  for (const UnitDesc& u : model.units) {
    const int64_t p = u.numel();
    ZERO3_REQUIRE(p > 0, InvalidArgument, "plan_traffic: unit '", u.name, "' has no elements");
    const int64_t slice = (p + w - 1) / w;
    units.push_back({p, slice * w, false});
    total_slice += slice;
    total_numel += p;
  }
  plan.slice_elements = total_slice;
  std::vector<int64_t> gathers(units.size(), 0);
  if (z.stage == 3) {
    ZERO3_REQUIRE(z.prefetch_bucket_size && z.param_persistence_threshold, ConfigError,
                  "zero_optimization.stage3_prefetch_bucket_size / stage3_param_persistence_threshold: still "
                  "\"auto\"; resolve the config (zero3 plan --hidden-size)");
    int64_t persistent_total = 0;
    for (auto& u : units) {
      if (u.numel <= *z.param_persistence_threshold && persistent_total + u.numel <= z.model_persistence_threshold) {
        u.persistent = true;
        persistent_total += u.numel;
      }
    }
    // Per optimizer step: a micro-steps. With keep_first_units the last of them releases everything before the
    // optimizer step, and each of the others keeps the next one's first units still gathered at its end, one
    // gather less for each in the next micro-step.
    const detail::SimulatedGathers last =
        detail::simulate_gathers(units, *z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance);
    const bool keep = a > 1 && options.keep_first_units;
    const detail::SimulatedGathers window = detail::simulate_gathers(
        units, *z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance, /*keep_first_units=*/keep);
    for (size_t i = 0; i < units.size(); ++i) {
      gathers[i] = last.gathers[i] + (a - 1) * (window.gathers[i] - (window.kept_at_end[i] ? 1 : 0));
    }
  }

  for (int rank = 0; rank < nodes.world; ++rank) {
    RankTraffic t;
    const GroupLink world = detail::link_of(layout.world_group(), nodes, rank);
    const GroupLink shard = detail::link_of(layout.shard_group(rank), nodes, rank);
    // qwZ: a gather of a non-persistent unit over two or more ranks moves each rank's piece of n elements as one
    // int8 message of quant_message_bytes(n) bytes (fp32 words on the wire), else n compute-dtype elements.
    auto gather = [&](const GroupLink& link, int64_t n, bool quantize) {
      if (quantize && z.quantized_weights) {
        count_collective(t.gathers, link, CollectiveKind::all_gather, quant_message_bytes(n, weights) / 4, 4);
      } else {
        count_collective(t.gathers, link, CollectiveKind::all_gather, n, c);
      }
    };
    // One gather of unit u from its partition (primary).
    auto partition_gather = [&](int64_t padded, bool quantize) {
      const int64_t slice = padded / w;
      t.primary_gather_elements += slice;
      quantize = quantize && w > 1;
      if (layout.hierarchical) {
        const detail::RankGroup inter = layout.shard_inter_node_group(rank);
        gather(detail::link_of(inter, nodes, rank), slice, quantize);
        const GroupLink intra = detail::link_of(layout.shard_intra_node_group(rank), nodes, rank);
        for (int j = 0; j < inter.size(); ++j) gather(intra, slice, quantize);
      } else {
        gather(shard, slice, quantize);
      }
    };
    if (z.stage == 3) {
      for (size_t i = 0; i < units.size(); ++i) {
        const detail::SimulatedUnit& u = units[i];
        if (u.persistent) {
          const CollectiveTraffic before = t.gathers;
          partition_gather(u.padded, false);  // re-gathered after the optimizer step, unquantized
          t.boundary_gathers += t.gathers - before;
          continue;
        }
        const int64_t n = gathers[i];
        if (layout.kind == detail::LayoutKind::hpz && n > 0) {
          partition_gather(u.padded, true);  // the first after the step fills the secondary partition
          t.secondary_fill_elements += u.padded / layout.hpz_size;
          const GroupLink hpz = detail::link_of(layout.hpz_group(rank), nodes, rank);
          const CollectiveTraffic before = t.gathers;
          for (int64_t k = 1; k < n; ++k) gather(hpz, u.padded / layout.hpz_size, true);
          t.secondary_gather_elements += (n - 1) * (u.padded / layout.hpz_size);
          t.secondary_gathers += t.gathers - before;
        } else {
          for (int64_t k = 0; k < n; ++k) partition_gather(u.padded, true);
        }
      }
    } else if (z.stage >= 1) {
      for (const auto& u : units) count_collective(t.gathers, world, CollectiveKind::all_gather, u.padded / w, c);
      t.boundary_gathers = t.gathers;
    }
    if (z.stage >= 2) {
      const int64_t chunk =
          std::max<int64_t>(1, std::min(std::max<int64_t>(1, *z.reduce_bucket_size / w), total_slice));
      if (z.quantized_gradients) {
        // qgZ: per bucket of f elements per rank, an all-to-all of int4 messages of N f elements within the node and
        // one of f elements across the nodes (a stage of one rank is skipped).
        const detail::RankGroup intra = layout.qgz_intra_group(rank), inter = layout.qgz_inter_group(rank);
        const GroupLink intra_link = detail::link_of(intra, nodes, rank), inter_link = detail::link_of(inter, nodes, rank);
        const QuantFormat grads{4, config.zero3.qgz_block_size};
        auto bucket = [&](int64_t f) {
          if (intra.size() > 1) {
            count_collective(t.reductions, intra_link, CollectiveKind::all_to_all,
                             quant_message_bytes(inter.size() * f, grads) / 4, 4);
          }
          if (inter.size() > 1) {
            count_collective(t.reductions, inter_link, CollectiveKind::all_to_all, quant_message_bytes(f, grads) / 4, 4);
          }
        };
        for (int64_t m = 0; m < a; ++m) {
          for (int64_t i = 0; i < total_slice / chunk; ++i) bucket(chunk);
          if (total_slice % chunk != 0) bucket(total_slice % chunk);
        }
      } else {
        for (int64_t m = 0; m < a; ++m) {
          count_buckets(t.reductions, shard, CollectiveKind::reduce_scatter, total_slice, chunk, cb);
        }
      }
      if (layout.replicas() > 1) {
        const CollectiveTraffic before = t.reductions;
        const int64_t across = std::max<int64_t>(1, std::min(*z.reduce_bucket_size, total_slice));
        count_buckets(t.reductions, detail::link_of(layout.replica_group(rank), nodes, rank),
                      CollectiveKind::all_reduce, total_slice, across, cb);
        t.boundary_reductions += t.reductions - before;
      }
    } else {
      const int64_t chunk = std::max<int64_t>(1, std::min(*z.reduce_bucket_size, total_numel));
      count_buckets(t.reductions, world, CollectiveKind::all_reduce, total_numel, chunk, cb);
      t.boundary_reductions = t.reductions;
    }
    plan.ranks.push_back(t);
  }
  return plan;
}

std::string format_traffic_plan(const TrafficPlan& p) {
  std::ostringstream os;
  os << "zero3 traffic plan: " << p.layout << ", " << p.gradient_accumulation_steps
     << " micro-step(s) per optimizer step; bytes sent per optimizer step (ring model)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-6s %-11s %20s %20s %12s\n", "node", "what", "within the node", "to other nodes",
                "collectives");
  os << line;
  for (int64_t n = 0; n < p.nodes; ++n) {
    CollectiveTraffic g, r;
    for (int64_t k = n * p.ranks_per_node; k < (n + 1) * p.ranks_per_node; ++k) {
      g += p.ranks[static_cast<size_t>(k)].gathers;
      r += p.ranks[static_cast<size_t>(k)].reductions;
    }
    for (const auto& [what, t] : {std::pair<const char*, CollectiveTraffic>{"gathers", g}, {"reductions", r}}) {
      std::snprintf(line, sizeof line, "%-6lld %-11s %20s %20s %12s\n", static_cast<long long>(n), what,
                    with_commas(t.intra_node_bytes).c_str(), with_commas(t.inter_node_bytes).c_str(),
                    (with_commas(t.inter_node_collectives) + "/" + with_commas(t.collectives)).c_str());
      os << line;
    }
  }
  os << "(collectives: crossing nodes / all, summed over the node's ranks)\n";
  return os.str();
}

}  // namespace zero3

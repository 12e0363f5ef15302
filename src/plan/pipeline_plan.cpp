#include "zero3/pipeline_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <utility>

#include "core/check.hpp"
#include "pipeline/layer_partition.hpp"
#include "plan/plan_format.hpp"
#include "plan/stage_group_nodes.hpp"
#include "zero/topology.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

pipeline::Schedule config_schedule(const Config& c) {
  ZERO3_REQUIRE(c.pipeline.stages.has_value(), ConfigError,
                "pipeline.stages: still \"auto\"; resolve the config with the program's stages first");
  ZERO3_REQUIRE(c.gradient_accumulation_steps.has_value(), ConfigError,
                "gradient_accumulation_steps: still \"auto\"; the pipeline's micro-batches are needed (zero3 plan "
                "--grad-accum)");
  const auto cap = [](int64_t v, int64_t most) { return static_cast<int>(std::min(v, most)); };
  return pipeline::make_schedule(pipeline::parse_schedule(c.zero3.pipeline_schedule, "zero3.pipeline_schedule"),
                                 cap(*c.pipeline.stages, 1 << 20), cap(*c.gradient_accumulation_steps, 1 << 20),
                                 cap(c.zero3.pipeline_virtual_stages, 4096));
}

// What one micro-batch keeps on one (virtual) stage between its forward and its backward, and what a rank holds once.
struct StageActivations {
  int64_t layers = 0;    // kept by the stage's layers: residual streams and, without checkpointing, caches
  int64_t received = 0;  // the activation received from the stage before
};

struct ActivationScale {
  int64_t decoder_layers = 0;  // a Llama's L (units 1..L), 0 without dims
  bool known = false;          // the whole model's activations were given
  int64_t stream = 0;          // one residual stream of a micro-batch
  int64_t layer_cache = 0;     // one layer's cache
};

ActivationScale activation_scale(const ModelDesc& model, const PipelinePlanOptions& o) {
  ActivationScale a;
  if (!o.dims) return a;
  const int64_t L = o.dims->num_hidden_layers;
  ZERO3_REQUIRE(L >= 1 && static_cast<int64_t>(model.units.size()) == L + 2, InvalidArgument, "plan_pipeline: model '",
                model.name, "' has ", model.units.size(), " units, expected a Llama's embedding, ", L,
                " decoder layers and head (llama_model_desc())");
  ZERO3_REQUIRE(!o.dims->tie_word_embeddings, InvalidArgument, "plan_pipeline: model '", model.name,
                "' ties its embeddings to its head; the pipeline plans do not model a weight shared by the first and "
                "the last stage");
  a.decoder_layers = L;
  if (!o.activations) return a;
  a.known = true;
  a.stream = o.activations->layer_inputs / (L + 1);
  a.layer_cache = o.checkpointing ? o.activations->layer_caches : o.activations->layer_caches / L;
  return a;
}

bool is_decoder_layer(const ActivationScale& a, int unit) { return unit >= 1 && unit <= a.decoder_layers; }

// "1 micro-batch", "3 micro-batches"
std::string micro_batches(int64_t n) { return std::to_string(n) + (n == 1 ? " micro-batch" : " micro-batches"); }

// The schedule walked for rank `r`: the most (micro-batch, stage) pairs held at once, and the bytes at the moment
// of the most bytes.
struct InFlight {
  int most = 0;
  StageActivations held;
};

InFlight walk_in_flight(const pipeline::Schedule& schedule, int r, const std::vector<StageActivations>& per_stage) {
  InFlight f;
  int count = 0;
  StageActivations now;
  for (const pipeline::Action& a : schedule.actions[static_cast<size_t>(r)]) {
    const StageActivations& s = per_stage[static_cast<size_t>(a.stage)];
    if (a.kind == pipeline::ActionKind::forward) {
      ++count;
      now.layers += s.layers;
      now.received += s.received;
      f.most = std::max(f.most, count);
      if (now.layers + now.received > f.held.layers + f.held.received) f.held = now;
    } else if (a.kind == pipeline::ActionKind::backward) {
      --count;
      now.layers -= s.layers;
      now.received -= s.received;
    }
  }
  return f;
}

}  // namespace

size_t PipelinePlan::worst_rank() const {
  size_t worst = 0;
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r].memory.rank_bytes(MemoryTier::device) > ranks[worst].memory.rank_bytes(MemoryTier::device)) worst = r;
  }
  return worst;
}

int64_t PipelinePlan::max_node_inter_node_bytes() const {
  return node_inter_node_bytes.empty() ? 0
                                       : *std::max_element(node_inter_node_bytes.begin(), node_inter_node_bytes.end());
}

PipelinePlan plan_pipeline(const ModelDesc& model, const Config& config, const PipelinePlanOptions& options) {
  ZERO3_REQUIRE(
      options.world_size >= 1 && options.ranks_per_node >= 1 && options.world_size % options.ranks_per_node == 0,
      InvalidArgument, "plan_pipeline: world_size ", options.world_size, " and ranks_per_node ", options.ranks_per_node,
      " must be >= 1, the node size dividing the world");
  ZERO3_REQUIRE(options.boundary_numel >= 0, InvalidArgument, "plan_pipeline: boundary_numel ", options.boundary_numel,
                " must be >= 0");
  ZERO3_REQUIRE(!model.units.empty(), InvalidArgument, "plan_pipeline: model '", model.name, "' has no units");
  PipelinePlan p;
  p.schedule = config_schedule(config);
  const int S = p.schedule.ranks, stages = p.schedule.stages();
  const int64_t m = p.schedule.micro_batches;
  const pipeline::PipelineTopology topology =
      detail::stage_topology(config, S, options.world_size, options.ranks_per_node);
  p.stage_order = pipeline::stage_order_name(topology.order);
  p.world_size = options.world_size;
  p.ranks_per_node = options.ranks_per_node;
  p.nodes = options.world_size / options.ranks_per_node;
  p.data_parallel = topology.data_parallel();
  p.group_ranks_per_node = detail::stage_group_nodes(topology).ranks_per_node;
  p.bubble = pipeline::bubble_fraction(p.schedule);
  p.boundary_numel = options.boundary_numel;
  p.activation_dtype = options.activation_dtype.value_or(config.compute_dtype());
  const int64_t boundary_one = options.boundary_numel * static_cast<int64_t>(dtype_size(p.activation_dtype));
  p.boundary_bytes_per_step = m * boundary_one;

  std::vector<pipeline::LayerInfo> layers;
  for (const UnitDesc& u : model.units) layers.push_back({u.name, u.numel()});
  p.bounds = pipeline::partition_layers(layers, stages, config.pipeline.partition);
  p.partition = pipeline::describe_partition(layers, p.bounds);

  const ActivationScale scale = activation_scale(model, options);
  std::vector<StageActivations> per_stage(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    int64_t l = 0;
    for (int u = p.bounds[static_cast<size_t>(s)]; u < p.bounds[static_cast<size_t>(s) + 1]; ++u) {
      l += is_decoder_layer(scale, u) ? 1 : 0;
    }
    StageActivations& a = per_stage[static_cast<size_t>(s)];
    a.layers =
        (l + (s == 0 && scale.known ? 1 : 0)) * scale.stream + (options.checkpointing ? 0 : l * scale.layer_cache);
    a.received = s > 0 ? boundary_one : 0;
  }

  MemoryPlanOptions memory;
  memory.world_size = p.data_parallel;
  memory.ranks_per_node = p.group_ranks_per_node;
  TrafficPlanOptions traffic;
  traffic.world_size = p.data_parallel;
  traffic.ranks_per_node = p.group_ranks_per_node;
  p.node_inter_node_bytes.assign(static_cast<size_t>(p.nodes), 0);
  p.node_boundary_inter_node_bytes.assign(static_cast<size_t>(p.nodes), 0);
  p.node_host_bytes.assign(static_cast<size_t>(p.nodes), 0);
  for (int r = 0; r < S; ++r) {
    PipelineRankPlan rp;
    rp.rank = r;
    rp.units.name = model.name + (S > 1 ? " (pipeline rank " + std::to_string(r) + ")" : "");
    for (int s = r; s < stages; s += S) {
      rp.stages.push_back(s);
      for (int u = p.bounds[static_cast<size_t>(s)]; u < p.bounds[static_cast<size_t>(s) + 1]; ++u) {
        rp.units.units.push_back(model.units[static_cast<size_t>(u)]);
        rp.decoder_layers += is_decoder_layer(scale, u) ? 1 : 0;
      }
    }
    rp.first = rp.stages.front() == 0;
    rp.last = rp.stages.back() == stages - 1;
    const InFlight f = walk_in_flight(p.schedule, r, per_stage);
    rp.in_flight = f.most;
    rp.held_activation_bytes = f.held.layers + f.held.received;
    if (scale.known) {
      const ActivationEstimate& e = *options.activations;
      rp.once_activation_bytes = e.workspace + e.unit_staging + (rp.last ? e.loss_chunk : 0);
      if (rp.decoder_layers > 0) rp.once_activation_bytes += e.attention + (options.checkpointing ? e.layer_caches : 0);
    }
    if (stages > 1) rp.once_activation_bytes += 2 * boundary_one;

    rp.memory = plan_memory(rp.units, config, memory);
    auto add = [&](int64_t bytes, std::string what) {
      if (bytes > 0)
        rp.memory.entries.push_back({MemoryCategory::activations, MemoryTier::device, bytes, std::move(what)});
    };
    const std::string held = micro_batches(f.most) + " in flight (" + pipeline::schedule_name(p.schedule.kind) + ")";
    add(f.held.layers, "activations kept for backward, " + held);
    add(f.held.received, "received activations kept for backward, " + held);
    add(rp.once_activation_bytes, "activation workspace and boundary buffers, once");
    if (config.zero.stage >= 2 && config.zero3.pipeline_reduce_once_per_step && stages > 1) {
      // zero3.pipeline_gradient_reduction "step": the stage's full gradients (padded over the partition, as the
      // engine holds them), summed over the step's micro-batches.
      const int64_t acc_bytes = static_cast<int64_t>(dtype_size(config.grad_accum_dtype.value_or(DType::f32)));
      rp.memory.entries.push_back({MemoryCategory::grads, MemoryTier::device, rp.memory.padded_params * acc_bytes,
                                   "full gradients over the step (zero3.pipeline_gradient_reduction \"step\")"});
    }
    rp.traffic = plan_traffic(rp.units, config, traffic);

    // The boundary transfers of every data-parallel index, from the schedule's sends and calls.
    for (int i = 0; i < p.data_parallel; ++i) {
      const int world_rank = topology.rank_of(r, i);
      rp.world_ranks.push_back(world_rank);
      const int node = topology.nodes.node_of(world_rank);
      int64_t sent = 0, off_node = 0;
      int calls_off_node = 0;
      bool call_crosses = false;
      for (const pipeline::Action& a : p.schedule.actions[static_cast<size_t>(r)]) {
        if (!a.is_transfer()) continue;
        if (!a.joins_previous) {
          calls_off_node += call_crosses ? 1 : 0;
          call_crosses = false;
        }
        const bool crosses = topology.nodes.node_of(topology.rank_of(a.peer_rank, i)) != node;
        call_crosses |= crosses;
        if (a.kind == pipeline::ActionKind::send_activation || a.kind == pipeline::ActionKind::send_gradient) {
          sent += boundary_one;
          off_node += crosses ? boundary_one : 0;
        }
      }
      calls_off_node += call_crosses ? 1 : 0;
      rp.boundary_sent_bytes = sent;
      rp.boundary_inter_node_bytes = std::max(rp.boundary_inter_node_bytes, off_node);
      rp.boundary_inter_node_calls = std::max(rp.boundary_inter_node_calls, calls_off_node);
      const RankTraffic& t = rp.traffic.ranks[static_cast<size_t>(i)];
      const size_t n = static_cast<size_t>(node);
      p.node_boundary_inter_node_bytes[n] += off_node;
      p.node_inter_node_bytes[n] += off_node + t.gathers.inter_node_bytes + t.reductions.inter_node_bytes;
      p.node_host_bytes[n] += rp.memory.rank_bytes(MemoryTier::host) +
                              (rp.memory.device_is_host ? rp.memory.rank_bytes(MemoryTier::device) : 0);
    }
    p.ranks.push_back(std::move(rp));
  }
  return p;
}

namespace {

std::string human(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= double(int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t{1} << 30));
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(int64_t{1} << 20));
  return buf;
}

}  // namespace

std::string format_pipeline_plan(const PipelinePlan& p) {
  std::ostringstream out;
  char buf[512];
  out << "zero3 pipeline plan: " << p.schedule.ranks << " pipeline ranks x " << p.schedule.stages_per_rank
      << " stage(s) per rank, " << pipeline::schedule_name(p.schedule.kind) << ", " << p.schedule.micro_batches
      << " micro-batches; " << p.data_parallel << " data-parallel ranks per stage (" << p.stage_order << ", "
      << p.group_ranks_per_node << " per node) on " << p.nodes << " nodes x " << p.ranks_per_node << " ranks\n";
  std::snprintf(buf, sizeof buf, "bubble %.4f; boundary: %s elements per micro-batch (%s), %s each way per step\n",
                p.bubble, detail::with_commas(p.boundary_numel).c_str(),
                std::string(dtype_name(p.activation_dtype)).c_str(),
                detail::with_commas(p.boundary_bytes_per_step).c_str());
  out << buf << "partition: " << p.partition << "\n\n";
  std::snprintf(buf, sizeof buf, "%-5s %-10s %6s %9s %12s %12s %12s %14s %14s %14s\n", "rank", "stages", "units",
                "in flight", "activations", "device", "host", "ZeRO intra", "ZeRO inter", "boundary off");
  out << buf;
  for (const PipelineRankPlan& r : p.ranks) {
    std::string stages;
    for (int s : r.stages) stages += (stages.empty() ? "" : ",") + std::to_string(s);
    CollectiveTraffic zero;
    for (const RankTraffic& t : r.traffic.ranks) {
      zero += t.gathers;
      zero += t.reductions;
    }
    const int64_t ranks = static_cast<int64_t>(r.traffic.ranks.size());
    std::snprintf(
        buf, sizeof buf, "%-5d %-10s %6zu %9d %12s %12s %12s %14s %14s %14s\n", r.rank, stages.c_str(),
        r.units.units.size(), r.in_flight, human(r.memory.rank_bytes(MemoryCategory::activations)).c_str(),
        human(r.memory.rank_bytes(MemoryTier::device)).c_str(), human(r.memory.rank_bytes(MemoryTier::host)).c_str(),
        human(zero.intra_node_bytes / std::max<int64_t>(ranks, 1)).c_str(),
        human(zero.inter_node_bytes / std::max<int64_t>(ranks, 1)).c_str(), human(r.boundary_inter_node_bytes).c_str());
    out << buf;
  }
  out << "(per world rank of the pipeline rank; ZeRO bytes per step averaged over its data-parallel group; boundary "
         "off: activations and gradients it sends to another node per step)\n";
  out << "worst rank: " << p.worst_rank() << " ("
      << human(p.ranks[p.worst_rank()].memory.rank_bytes(MemoryTier::device)) << " on the device)\n";
  for (size_t n = 0; n < p.node_inter_node_bytes.size(); ++n) {
    std::snprintf(buf, sizeof buf, "node %zu: %s to other nodes per step (%s of it stage boundaries)\n", n,
                  detail::with_commas(p.node_inter_node_bytes[n]).c_str(),
                  detail::with_commas(p.node_boundary_inter_node_bytes[n]).c_str());
    out << buf;
  }
  return out.str();
}

}  // namespace zero3

#include "zero3/pipeline_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "config/config_checks.hpp"
#include "core/check.hpp"
#include "plan/step_time_parts.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

// Every node's ZeRO bytes to other nodes per step, by phase: the link each rank's group shares with the others on
// its node.
struct NodeLinks {
  std::vector<int64_t> micro, boundary;
};

NodeLinks node_links(const PipelinePlan& p) {
  NodeLinks l;
  l.micro.assign(static_cast<size_t>(p.nodes), 0);
  l.boundary.assign(static_cast<size_t>(p.nodes), 0);
  for (const PipelineRankPlan& r : p.ranks) {
    for (size_t i = 0; i < r.world_ranks.size(); ++i) {
      const detail::PhaseBytes b(r.traffic.ranks[i]);
      const size_t node = static_cast<size_t>(r.world_ranks[i] / p.ranks_per_node);
      l.micro[node] += b.micro().inter_node_bytes;
      l.boundary[node] += b.boundary().inter_node_bytes;
    }
  }
  return l;
}

}  // namespace

PipelineStepTime model_pipeline_step_time(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                                          const ClusterDesc& cluster, const StepTimeOptions& options) {
  ZERO3_REQUIRE(options.seq_len >= 1, InvalidArgument, "model_pipeline_step_time: seq_len ", options.seq_len,
                " must be at least 1");
  // plan_pipeline() checks the units against the dimensions (embedding, layers, head) and refuses tied embeddings.
  ZERO3_REQUIRE(dims.hidden_size > 0 && dims.num_attention_heads > 0 && dims.num_hidden_layers > 0, InvalidArgument,
                "model_pipeline_step_time: the model's Llama dimensions are needed for each stage's FLOPs (a Hugging "
                "Face Llama config.json, not a unit list)");
  ZERO3_REQUIRE(config.zero.stage >= 1 && config.zero.stage <= 3, ConfigError,
                "zero_optimization.stage: ", config.zero.stage,
                "; the pipelined step-time model covers stages 1-3 inside the stages");
  const int64_t micro_batch =
      detail::require_batch(config.train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu");
  const int64_t m = detail::require_batch(config.gradient_accumulation_steps, "gradient_accumulation_steps");
  config_detail::check_layouts(config);
  config_detail::check_quantization_precision(config);

  PipelinePlanOptions po;
  po.world_size = cluster.world();
  po.ranks_per_node = cluster.gpus_per_node;
  po.boundary_numel = micro_batch * options.seq_len * dims.hidden_size;
  po.dims = dims;
  const PipelinePlan p = plan_pipeline(model, config, po);
  const NodeLinks links = node_links(p);
  const int64_t c = static_cast<int64_t>(dtype_size(config.compute_dtype()));
  const double md = static_cast<double>(m);
  const double inter_bw = cluster.inter_node_gb_s() * 1e9, nccl_bw = cluster.nccl_link_gb_s() * 1e9;
  const double pcie_bw = cluster.pcie_effective_gb_s() * 1e9, nvme_bw = cluster.nvme_gb_s * 1e9;
  const bool fixed = cluster.collective_overhead_ms > 0;
  const double overhead_s = cluster.collective_overhead_ms / 1e3;
  const double tokens = static_cast<double>(micro_batch * options.seq_len);

  PipelineStepTime out;
  out.bubble = p.bubble;
  double slowest = -1, slowest_fixed = 0, boundary_s = 0, boundary_fixed_s = 0;
  StepTime& sum = out.time;
  for (const PipelineRankPlan& r : p.ranks) {
    StepTime t;
    t.grad_accum = static_cast<int>(m);
    t.layout = r.traffic.layout;
    double matmul = static_cast<double>(r.units.numel());
    if (r.first) matmul -= static_cast<double>(dims.vocab_size * dims.hidden_size);  // the lookup table
    const double micro_flops =
        3 * detail::forward_flops_per_token(matmul, r.decoder_layers, dims, options.seq_len) * tokens;
    t.tokens_per_gpu = micro_batch * options.seq_len * m;
    t.flops_per_gpu = micro_flops * md;
    t.compute_s = micro_flops / (cluster.gpu_bf16_tflops * 1e12 * cluster.matmul_efficiency);

    int64_t link_micro = 0, link_boundary = 0, micro_intra = 0, boundary_intra = 0, primary = 0, fill = 0, read = 0;
    int64_t micro_collectives = 0, boundary_collectives = 0, node_transfers = 0;
    for (size_t i = 0; i < r.world_ranks.size(); ++i) {
      const RankTraffic& rt = r.traffic.ranks[i];
      const detail::PhaseBytes b(rt);
      const size_t node = static_cast<size_t>(r.world_ranks[i] / p.ranks_per_node);
      link_micro = std::max(link_micro, links.micro[node]);
      link_boundary = std::max(link_boundary, links.boundary[node]);
      node_transfers = std::max(node_transfers, p.node_boundary_inter_node_bytes[node]);
      micro_intra = std::max(micro_intra, b.micro().intra_node_bytes);
      boundary_intra = std::max(boundary_intra, b.boundary().intra_node_bytes);
      primary = std::max(primary, rt.primary_gather_elements);
      fill = std::max(fill, rt.secondary_fill_elements);
      read = std::max(read, rt.secondary_gather_elements);
      micro_collectives = std::max(micro_collectives, b.micro().inter_node_collectives);
      boundary_collectives = std::max(boundary_collectives, b.boundary().inter_node_collectives);
    }
    const int64_t owned = r.traffic.slice_elements;
    const detail::HostCopies copies = detail::host_copies(config, m, owned, primary, fill, read, false);
    t.node_inter_bytes = link_micro + link_boundary + node_transfers;
    t.gpu_intra_bytes = micro_intra + boundary_intra + (r.boundary_sent_bytes - r.boundary_inter_node_bytes);
    t.gpu_h2d_bytes = copies.micro_h2d + copies.step_h2d;
    t.gpu_d2h_bytes = copies.micro_d2h + copies.step_d2h;
    t.inter_node_s = static_cast<double>(link_micro) / md / inter_bw;
    t.intra_node_s = static_cast<double>(micro_intra) / md / pcie_bw;
    t.offload_s = static_cast<double>(std::max(copies.micro_h2d, copies.micro_d2h)) / md / pcie_bw;
    if (config.zero.offload_param.device == OffloadDevice::nvme) {
      t.offload_s = std::max(t.offload_s, static_cast<double>(primary * c * cluster.gpus_per_node) / md / nvme_bw);
    }
    std::tie(t.micro_step_s, t.bound) = detail::busiest(t.compute_s, t.inter_node_s, t.intra_node_s, t.offload_s);
    t.boundary_comm_s =
        std::max(static_cast<double>(link_boundary) / inter_bw, static_cast<double>(boundary_intra) / pcie_bw);
    const detail::StepRest rest = detail::step_rest(config, cluster, owned, cluster.gpus_per_node, copies);
    t.optimizer_s = rest.optimizer_s;
    t.step_offload_s = rest.step_offload_s;
    t.nvme_s = rest.nvme_s;
    t.boundary_s = t.boundary_comm_s + std::max({rest.optimizer_s, rest.step_offload_s, rest.nvme_s});

    // The boundary transfers of one schedule step: the node's share of its link, and the rank's within its node.
    const double in_node = static_cast<double>(r.boundary_sent_bytes - r.boundary_inter_node_bytes) / md / pcie_bw;
    const double transfer = static_cast<double>(node_transfers) / md / inter_bw + in_node;
    const double transfer_fixed = static_cast<double>(node_transfers) / md / nccl_bw +
                                  static_cast<double>(r.boundary_inter_node_calls) / md * overhead_s + in_node;

    t.has_fixed_cost = fixed;
    t.inter_node_collectives = micro_collectives + boundary_collectives + r.boundary_inter_node_calls;
    t.inter_node_fixed_s =
        fixed ? (static_cast<double>(link_micro) / nccl_bw + static_cast<double>(micro_collectives) * overhead_s) / md
              : t.inter_node_s;
    std::tie(t.micro_step_fixed_s, t.bound_fixed) =
        detail::busiest(t.compute_s, t.inter_node_fixed_s, t.intra_node_s, t.offload_s);
    t.boundary_comm_fixed_s = fixed ? std::max(static_cast<double>(link_boundary) / nccl_bw +
                                                   static_cast<double>(boundary_collectives) * overhead_s,
                                               static_cast<double>(boundary_intra) / pcie_bw)
                                    : t.boundary_comm_s;
    t.boundary_fixed_s = t.boundary_comm_fixed_s + (t.boundary_s - t.boundary_comm_s);

    const double slot = t.micro_step_s + transfer;
    const double slot_fixed = (fixed ? t.micro_step_fixed_s + transfer_fixed : slot);
    if (slot > slowest) {
      slowest = slot;
      out.slowest_rank = out.ranks.size();
    }
    slowest_fixed = std::max(slowest_fixed, slot_fixed);
    boundary_s = std::max(boundary_s, t.boundary_s);
    boundary_fixed_s = std::max(boundary_fixed_s, t.boundary_fixed_s);
    // The rank's own step, as if it set the pace.
    t.step_s = md * slot / (1 - p.bubble) + t.boundary_s;
    t.step_fixed_s = md * slot_fixed / (1 - p.bubble) + t.boundary_fixed_s;
    out.transfer_s.push_back(transfer);
    out.transfer_fixed_s.push_back(fixed ? transfer_fixed : transfer);
    out.ranks.push_back(t);

    sum.gpu_intra_bytes = std::max(sum.gpu_intra_bytes, t.gpu_intra_bytes);
    sum.gpu_h2d_bytes = std::max(sum.gpu_h2d_bytes, t.gpu_h2d_bytes);
    sum.gpu_d2h_bytes = std::max(sum.gpu_d2h_bytes, t.gpu_d2h_bytes);
    sum.inter_node_collectives = std::max(sum.inter_node_collectives, t.inter_node_collectives);
  }
  out.pipeline_s = md * slowest / (1 - p.bubble);
  out.pipeline_fixed_s = md * slowest_fixed / (1 - p.bubble);

  const StepTime& pace = out.ranks[out.slowest_rank];
  sum.flow = DataFlow::zero3;
  sum.layout =
      "pipeline " + std::to_string(p.schedule.ranks) + " x " + pipeline::schedule_name(p.schedule.kind) +
      (p.schedule.stages_per_rank > 1 ? " (" + std::to_string(p.schedule.stages_per_rank) + " per rank)" : "") +
      ", ZeRO-" + std::to_string(config.zero.stage) + " over " + std::to_string(p.data_parallel) + " ranks";
  sum.grad_accum = static_cast<int>(m);
  sum.tokens_per_gpu = pace.tokens_per_gpu;
  sum.flops_per_gpu = pace.flops_per_gpu;
  sum.node_inter_bytes = p.max_node_inter_node_bytes();
  for (int64_t b : p.node_inter_node_bytes) sum.cluster_inter_bytes += b;
  sum.compute_s = pace.compute_s;
  sum.inter_node_s = pace.inter_node_s;
  sum.intra_node_s = pace.intra_node_s;
  sum.offload_s = pace.offload_s;
  sum.micro_step_s = slowest;
  sum.bound = out.transfer_s[out.slowest_rank] > pace.micro_step_s ? "boundary transfers" : pace.bound;
  sum.boundary_comm_s = pace.boundary_comm_s;
  sum.optimizer_s = pace.optimizer_s;
  sum.step_offload_s = pace.step_offload_s;
  sum.nvme_s = pace.nvme_s;
  sum.boundary_s = boundary_s;
  sum.step_s = out.pipeline_s + boundary_s;
  sum.has_fixed_cost = fixed;
  sum.inter_node_fixed_s = pace.inter_node_fixed_s;
  sum.micro_step_fixed_s = slowest_fixed;
  sum.bound_fixed = pace.bound_fixed;
  sum.boundary_comm_fixed_s = pace.boundary_comm_fixed_s;
  sum.boundary_fixed_s = boundary_fixed_s;
  sum.step_fixed_s = out.pipeline_fixed_s + boundary_fixed_s;
  return out;
}

std::string format_pipeline_step_time(const PipelineStepTime& pt, int64_t steps) {
  std::ostringstream out;
  char buf[512];
  const StepTime& t = pt.time;
  std::snprintf(buf, sizeof buf, "%s: %d micro-batches, bubble %.4f\n", t.layout.c_str(), t.grad_accum, pt.bubble);
  out << buf;
  std::snprintf(buf, sizeof buf, "%-5s %10s %11s %11s %10s %10s %12s %14s %11s\n", "rank", "compute", "ZeRO inter",
                "ZeRO intra", "offload", "transfers", "sched. step", "(fixed cost)", "boundary");
  out << buf;
  for (size_t r = 0; r < pt.ranks.size(); ++r) {
    const StepTime& s = pt.ranks[r];
    std::snprintf(buf, sizeof buf, "%-5zu %8.3f s %9.3f s %9.3f s %8.3f s %8.3f s %10.3f s %12.3f s %9.3f s%s\n", r,
                  s.compute_s, s.inter_node_s, s.intra_node_s, s.offload_s, pt.transfer_s[r],
                  s.micro_step_s + pt.transfer_s[r], s.micro_step_fixed_s + pt.transfer_fixed_s[r], s.boundary_s,
                  r == pt.slowest_rank ? "  <- sets the pace" : "");
    out << buf;
  }
  const double n = static_cast<double>(steps);
  std::snprintf(buf, sizeof buf,
                "pipeline: %d x %.3f s / (1 - %.4f) = %.2f s (fixed cost: %.2f s); boundary %.2f s (%.2f s)\n"
                "step %s, %lld steps %s\n"
                "sent to other nodes per step: %.2f MB by the busiest node, %.2f MB by all nodes together\n",
                t.grad_accum, t.micro_step_s, pt.bubble, pt.pipeline_s, pt.pipeline_fixed_s, t.boundary_s,
                t.boundary_fixed_s, format_seconds_range(t.step_low_s(), t.step_high_s()).c_str(),
                static_cast<long long>(steps), format_seconds_range(t.step_low_s() * n, t.step_high_s() * n).c_str(),
                static_cast<double>(t.node_inter_bytes) / 1e6, static_cast<double>(t.cluster_inter_bytes) / 1e6);
  out << buf;
  return out.str();
}

}  // namespace zero3

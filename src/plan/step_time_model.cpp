#include "zero3/step_time_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <tuple>
#include <utility>

#include "config/config_checks.hpp"
#include "core/check.hpp"
#include "plan/step_time_parts.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3 {
namespace {

// The FLOPs of one token's forward pass: every weight matrix once, the embedding lookup none.
double forward_flops_per_token(const ModelDesc& model, const LlamaDims& d, int64_t seq_len) {
  double matmul = static_cast<double>(model.numel());
  if (!d.tie_word_embeddings) matmul -= static_cast<double>(d.vocab_size * d.hidden_size);  // the lookup table
  return detail::forward_flops_per_token(matmul, d.num_hidden_layers, d, seq_len);
}

}  // namespace

StepTime model_step_time(const ModelDesc& model, const LlamaDims& dims, const Config& config,
                         const ClusterDesc& cluster, const StepTimeOptions& options) {
  ZERO3_REQUIRE(options.seq_len >= 1, InvalidArgument, "model_step_time: seq_len ", options.seq_len,
                " must be at least 1");
  ZERO3_REQUIRE(dims.hidden_size > 0 && dims.num_attention_heads > 0 && dims.num_hidden_layers > 0, InvalidArgument,
                "model_step_time: the model's Llama dimensions are needed for its FLOPs (a Hugging Face Llama "
                "config.json, not a unit list)");
  ZERO3_REQUIRE(cluster.world() >= 1, InvalidArgument, "model_step_time: the cluster has no GPUs");
  const int64_t micro_batch =
      detail::require_batch(config.train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu");
  const int64_t ga = detail::require_batch(config.gradient_accumulation_steps, "gradient_accumulation_steps");
  const ZeroConfig& z = config.zero;

  ZERO3_REQUIRE(z.stage == 3, ConfigError, "zero_optimization.stage: ", z.stage,
                "; the step-time model covers stage 3 (parameters gathered every micro-step)");

  const bool deepspeed = options.flow == DataFlow::deepspeed;
  Config flow_config = config;
  if (deepspeed) {  // plain ZeRO-3: DeepSpeed's hpZ, MiCS and ZeRO++ quantization are other data flows
    flow_config.zero.hpz_partition_size = 1;
    flow_config.zero.mics_shard_size = -1;
    flow_config.zero.mics_hierarchical_params_gather = false;
    flow_config.zero.quantized_weights = false;
    flow_config.zero.quantized_gradients = false;
  }
  config_detail::check_layouts(flow_config);  // as the engine: qgZ's block size, the keys' stage
  config_detail::check_quantization_precision(flow_config);
  // The bytes: the engine's own accounting (traffic_plan.hpp), on the cluster's nodes; with qwZ and qgZ, the
  // quantized messages the engine sends.
  TrafficPlanOptions traffic_options;
  traffic_options.world_size = cluster.world();
  traffic_options.ranks_per_node = cluster.gpus_per_node;
  traffic_options.keep_first_units = !deepspeed;  // DeepSpeed releases every unit at a micro-step's end
  const TrafficPlan plan = plan_traffic(model, flow_config, traffic_options);
  const int64_t c = static_cast<int64_t>(dtype_size(config.compute_dtype()));

  StepTime t;
  t.flow = options.flow;
  t.layout = plan.layout;
  if (flow_config.zero.quantized_weights) t.layout += " + qwZ";
  if (flow_config.zero.quantized_gradients) t.layout += " + qgZ";
  t.grad_accum = static_cast<int>(ga);
  t.tokens_per_gpu = micro_batch * options.seq_len * ga;
  const double micro_flops = 3 * forward_flops_per_token(model, dims, options.seq_len) *
                             static_cast<double>(micro_batch * options.seq_len);  // backward: twice the forward
  t.flops_per_gpu = micro_flops * static_cast<double>(ga);

  // The busiest node's link and the busiest GPU's intra-node traffic, in the micro-steps and at the boundary.
  const int per_node = cluster.gpus_per_node;
  int64_t node_micro_inter = 0, node_boundary_inter = 0, max_micro_intra = 0, max_boundary_intra = 0;
  int64_t primary_slice = 0, micro_inter_collectives = 0, boundary_inter_collectives = 0;
  int64_t secondary_fill = 0, secondary_read = 0;
  for (int node = 0; node < cluster.nodes; ++node) {
    int64_t micro_inter = 0, boundary_inter = 0;
    for (int r = node * per_node; r < (node + 1) * per_node; ++r) {
      const RankTraffic& rank = plan.ranks[static_cast<size_t>(r)];
      const detail::PhaseBytes b(rank);
      const CollectiveTraffic micro = b.micro(), boundary = b.boundary();
      micro_inter += micro.inter_node_bytes;
      boundary_inter += boundary.inter_node_bytes;
      t.cluster_inter_bytes += micro.inter_node_bytes + boundary.inter_node_bytes;
      max_micro_intra = std::max(max_micro_intra, micro.intra_node_bytes);
      max_boundary_intra = std::max(max_boundary_intra, boundary.intra_node_bytes);
      primary_slice = std::max(primary_slice, rank.primary_gather_elements);
      secondary_fill = std::max(secondary_fill, rank.secondary_fill_elements);
      secondary_read = std::max(secondary_read, rank.secondary_gather_elements);
      micro_inter_collectives = std::max(micro_inter_collectives, micro.inter_node_collectives);
      boundary_inter_collectives = std::max(boundary_inter_collectives, boundary.inter_node_collectives);
    }
    node_micro_inter = std::max(node_micro_inter, micro_inter);
    node_boundary_inter = std::max(node_boundary_inter, boundary_inter);
  }
  const int64_t owned = plan.slice_elements;
  t.node_inter_bytes = node_micro_inter + node_boundary_inter;
  t.gpu_intra_bytes = max_micro_intra + max_boundary_intra;

  // Copies between the GPU and host memory, per optimizer step: during the micro-steps and at the boundary.
  const detail::HostCopies copies =
      detail::host_copies(config, ga, owned, primary_slice, secondary_fill, secondary_read, deepspeed);
  const int64_t micro_h2d = copies.micro_h2d, micro_d2h = copies.micro_d2h;
  const int64_t step_h2d = copies.step_h2d, step_d2h = copies.step_d2h;
  t.gpu_h2d_bytes = micro_h2d + step_h2d;
  t.gpu_d2h_bytes = micro_d2h + step_d2h;

  const double inter_bw = cluster.inter_node_gb_s() * 1e9;
  const double pcie_bw = cluster.pcie_effective_gb_s() * 1e9;
  const double nvme_bw = cluster.nvme_gb_s * 1e9;
  const double gad = static_cast<double>(ga);

  t.compute_s = micro_flops / (cluster.gpu_bf16_tflops * 1e12 * cluster.matmul_efficiency);
  t.inter_node_s = static_cast<double>(node_micro_inter) / gad / inter_bw;
  t.intra_node_s = static_cast<double>(max_micro_intra) / gad / pcie_bw;  // GPUs of a node meet over PCIe
  t.offload_s = static_cast<double>(std::max(micro_h2d, micro_d2h)) / gad / pcie_bw;
  if (z.offload_param.device == OffloadDevice::nvme) {
    t.offload_s = std::max(t.offload_s, static_cast<double>(primary_slice * c * per_node) / gad / nvme_bw);
  }
  std::tie(t.micro_step_s, t.bound) = detail::busiest(t.compute_s, t.inter_node_s, t.intra_node_s, t.offload_s);

  t.boundary_comm_s =
      std::max(static_cast<double>(node_boundary_inter) / inter_bw, static_cast<double>(max_boundary_intra) / pcie_bw);
  const detail::StepRest rest = detail::step_rest(config, cluster, owned, per_node, copies);
  t.optimizer_s = rest.optimizer_s;
  t.step_offload_s = rest.step_offload_s;
  t.nvme_s = rest.nvme_s;
  const double boundary_rest_s = std::max({t.optimizer_s, t.step_offload_s, t.nvme_s});
  t.boundary_s = t.boundary_comm_s + boundary_rest_s;
  t.step_s = gad * t.micro_step_s + t.boundary_s;

  // The fixed-cost reading: the node link at NCCL's rate, plus the overhead of every collective that crosses nodes
  // (each rank issues its own in sequence; the busiest rank's count).
  t.inter_node_collectives = micro_inter_collectives + boundary_inter_collectives;
  t.has_fixed_cost = cluster.collective_overhead_ms > 0;
  if (!t.has_fixed_cost) {
    t.inter_node_fixed_s = t.inter_node_s;
    t.micro_step_fixed_s = t.micro_step_s;
    t.bound_fixed = t.bound;
    t.boundary_comm_fixed_s = t.boundary_comm_s;
    t.boundary_fixed_s = t.boundary_s;
    t.step_fixed_s = t.step_s;
    return t;
  }
  const double nccl_bw = cluster.nccl_link_gb_s() * 1e9;
  const double overhead_s = cluster.collective_overhead_ms / 1e3;
  t.inter_node_fixed_s =
      (static_cast<double>(node_micro_inter) / nccl_bw + static_cast<double>(micro_inter_collectives) * overhead_s) /
      gad;
  std::tie(t.micro_step_fixed_s, t.bound_fixed) =
      detail::busiest(t.compute_s, t.inter_node_fixed_s, t.intra_node_s, t.offload_s);
  t.boundary_comm_fixed_s = std::max(
      static_cast<double>(node_boundary_inter) / nccl_bw + static_cast<double>(boundary_inter_collectives) * overhead_s,
      static_cast<double>(max_boundary_intra) / pcie_bw);
  t.boundary_fixed_s = t.boundary_comm_fixed_s + boundary_rest_s;
  t.step_fixed_s = gad * t.micro_step_fixed_s + t.boundary_fixed_s;
  return t;
}

namespace {

// The x in [lo, hi] where f(x) = target, for f monotonic on it, by bisection; nullopt when target lies outside
// [f(lo), f(hi)].
template <typename F>
std::optional<double> solve_monotonic(F f, double lo, double hi, double target) {
  double f_lo = f(lo);
  if ((target - f_lo) * (target - f(hi)) > 0) return std::nullopt;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * std::max(1.0, std::abs(hi)); ++i) {
    const double mid = (lo + hi) / 2, f_mid = f(mid);
    if ((target - f_lo) * (target - f_mid) <= 0) {
      hi = mid;
    } else {
      lo = mid;
      f_lo = f_mid;
    }
  }
  return (lo + hi) / 2;
}

}  // namespace

NetworkFit fit_network(const ModelDesc& model, const LlamaDims& dims, const Config& config, const ClusterDesc& cluster,
                       const StepTimeOptions& options, double measured_step_s) {
  ZERO3_REQUIRE(std::isfinite(measured_step_s) && measured_step_s > 0, InvalidArgument, "fit_network: measured step ",
                measured_step_s, " s is not a positive time");
  StepTimeOptions ds = options;
  ds.flow = DataFlow::deepspeed;
  NetworkFit fit;
  fit.measured_step_s = measured_step_s;
  fit.modelled = model_step_time(model, dims, config, cluster, ds);
  ClusterDesc c = cluster;
  c.collective_overhead_ms = 0;  // the bandwidth reading alone
  fit.collective_efficiency = solve_monotonic(
      [&](double eff) {
        c.collective_efficiency = eff;
        return model_step_time(model, dims, config, c, ds).step_s;
      },
      1e-6, 1.0, measured_step_s);
  c = cluster;
  c.collective_efficiency = 1;
  // An overhead of hours per collective is no fit; the bisection needs an upper end.
  fit.collective_overhead_ms = solve_monotonic(
      [&](double ms) {
        c.collective_overhead_ms = ms;
        return model_step_time(model, dims, config, c, ds).step_fixed_s;
      },
      1e-9, 1e7, measured_step_s);
  return fit;
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string seconds(double s) { return s >= 100 ? fmt("%.0f s", s) : s >= 1 ? fmt("%.2f s", s) : fmt("%.3f s", s); }
std::string gigabytes(int64_t b) {
  const double x = static_cast<double>(b);
  return x >= 1e9 ? fmt("%.2f GB", x / 1e9) : fmt("%.2f MB", x / 1e6);
}

}  // namespace

std::string format_step_times(const std::vector<std::string>& headers, const std::vector<StepTime>& columns,
                              int64_t steps) {
  ZERO3_REQUIRE(headers.size() == columns.size(), InvalidArgument, "format_step_times: ", headers.size(),
                " headers for ", columns.size(), " columns");
  size_t width = 24;
  for (const auto& h : headers) width = std::max(width, h.size() + 2);
  for (const auto& c : columns) width = std::max(width, c.layout.size() + 2);
  std::ostringstream out;
  auto row = [&](const std::string& label, auto cell) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%-44s", label.c_str());
    out << buf;
    for (const StepTime& c : columns) {
      std::string v = cell(c);
      out << v << std::string(width > v.size() ? width - v.size() : 1, ' ');
    }
    out << '\n';
  };
  row("", [&](const StepTime& c) { return headers[static_cast<size_t>(&c - columns.data())]; });
  row("layout", [](const StepTime& c) { return c.layout; });
  row("tokens per GPU per step", [](const StepTime& c) { return std::to_string(c.tokens_per_gpu); });
  row("TFLOP per GPU per step", [](const StepTime& c) { return fmt("%.4g", c.flops_per_gpu / 1e12); });
  out << "bytes per optimizer step\n";
  row("  node link: sent to other nodes", [](const StepTime& c) { return gigabytes(c.node_inter_bytes); });
  row("  all nodes' links together", [](const StepTime& c) { return gigabytes(c.cluster_inter_bytes); });
  row("  intra-node: sent by the busiest GPU", [](const StepTime& c) { return gigabytes(c.gpu_intra_bytes); });
  row("  PCIe host->GPU, busiest GPU", [](const StepTime& c) { return gigabytes(c.gpu_h2d_bytes); });
  row("  PCIe GPU->host, busiest GPU", [](const StepTime& c) { return gigabytes(c.gpu_d2h_bytes); });
  out << "one micro-step (these overlap: the slowest sets it)\n";
  row("  compute (forward + backward)", [](const StepTime& c) { return seconds(c.compute_s); });
  row("  inter-node: gathers + reductions", [](const StepTime& c) { return seconds(c.inter_node_s); });
  row("  intra-node: gathers + reductions", [](const StepTime& c) { return seconds(c.intra_node_s); });
  row("  PCIe offload copies", [](const StepTime& c) { return seconds(c.offload_s); });
  row("  = micro-step", [](const StepTime& c) { return seconds(c.micro_step_s) + " (" + c.bound + ")"; });
  out << "after the last micro-step (not overlapped with it)\n";
  row("  boundary collectives", [](const StepTime& c) { return seconds(c.boundary_comm_s); });
  row("  Adam (on the CPU if offloaded, else GPU)", [](const StepTime& c) { return seconds(c.optimizer_s); });
  row("  PCIe copies of the step", [](const StepTime& c) { return seconds(c.step_offload_s); });
  row("  NVMe", [](const StepTime& c) { return seconds(c.nvme_s); });
  row("  = boundary: collectives + max(rest)", [](const StepTime& c) { return seconds(c.boundary_s); });
  row("step: grad_accum x micro-step + boundary", [](const StepTime& c) { return seconds(c.step_s); });
  row(std::to_string(steps) + " steps",
      [&](const StepTime& c) { return seconds(c.step_s * static_cast<double>(steps)); });
  const bool fixed = std::any_of(columns.begin(), columns.end(), [](const StepTime& c) { return c.has_fixed_cost; });
  if (!fixed) {
    out << "(one reading of the network: the cluster description has no collective_overhead_ms for the other)\n";
    return out.str();
  }
  out << "read as a fixed cost per collective that crosses nodes (collective_overhead_ms)\n";
  row("  inter-node collectives, busiest rank",
      [](const StepTime& c) { return std::to_string(c.inter_node_collectives); });
  row("  inter-node, per micro-step", [](const StepTime& c) { return seconds(c.inter_node_fixed_s); });
  row("  = micro-step", [](const StepTime& c) { return seconds(c.micro_step_fixed_s) + " (" + c.bound_fixed + ")"; });
  row("  boundary collectives", [](const StepTime& c) { return seconds(c.boundary_comm_fixed_s); });
  row("  step", [](const StepTime& c) { return seconds(c.step_fixed_s); });
  out << "the prediction: the range between the two readings\n";
  row("step, low-high", [](const StepTime& c) { return format_seconds_range(c.step_low_s(), c.step_high_s()); });
  row(std::to_string(steps) + " steps, low-high", [&](const StepTime& c) {
    const double n = static_cast<double>(steps);
    return format_seconds_range(c.step_low_s() * n, c.step_high_s() * n);
  });
  return out.str();
}

std::string format_seconds_range(double low_s, double high_s) {
  if (seconds(low_s) == seconds(high_s)) return seconds(low_s);
  std::string low = seconds(low_s);
  low.resize(low.size() - 2);  // the unit once, after the high end
  return low + "-" + seconds(high_s);
}

std::string format_layout_table(const std::vector<std::string>& names, const std::vector<StepTime>& rows,
                                const StepTime& baseline, int64_t steps, const std::vector<std::string>& notes) {
  ZERO3_REQUIRE(names.size() == rows.size() && (notes.empty() || notes.size() == rows.size()), InvalidArgument,
                "format_layout_table: ", names.size(), " names and ", notes.size(), " notes for ", rows.size(),
                " rows");
  std::ostringstream out;
  char buf[320];
  std::snprintf(buf, sizeof buf, "%-32s %15s %22s %10s %17s %17s %8s\n", "layout", "node link/step",
                "micro-step (bound)", "boundary", "step, low-high", (std::to_string(steps) + " steps").c_str(),
                "vs DS");
  out << buf;
  const double n = static_cast<double>(steps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepTime& t = rows[i];
    std::snprintf(buf, sizeof buf, "%-32s %15s %22s %10s %17s %17s %7.2fx%s%s\n", names[i].c_str(),
                  gigabytes(t.node_inter_bytes).c_str(), (seconds(t.micro_step_s) + " (" + t.bound + ")").c_str(),
                  seconds(t.boundary_s).c_str(), format_seconds_range(t.step_low_s(), t.step_high_s()).c_str(),
                  format_seconds_range(t.step_low_s() * n, t.step_high_s() * n).c_str(), t.step_s / baseline.step_s,
                  notes.empty() || notes[i].empty() ? "" : "  ", notes.empty() ? "" : notes[i].c_str());
    out << buf;
  }
  return out.str();
}

}  // namespace zero3

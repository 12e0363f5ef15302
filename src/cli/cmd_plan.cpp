// `zero3 plan`: the dry-run memory plan of a model under a DeepSpeed config, per rank and per node, before
// anything is allocated; with --cluster, the modelled step time of the run on that cluster instead
// (step_time_model.hpp); with --advise, every layout for the config on that cluster, ranked (layout_advisor.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "config/config_file.hpp"
#include "io/atomic_file.hpp"
#include "zero3/activation_plan.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/layout_advisor.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/pipeline_plan.hpp"
#include "zero3/step_time_model.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::cli {
namespace {

constexpr const char* kUsage =
    "usage: zero3 plan --model MODEL.json --config DS_CONFIG.json --world-size N [--ranks-per-node K]\n"
    "                  [--hidden-size H] [--seq-len N [--no-grad-checkpointing]] [--activation-bytes BYTES]\n"
    "                  [--micro-batch M] [--grad-accum G] [--precision bf16|fp16|fp32] [--lr X]\n"
    "\n"
    "Prints the bytes each rank and each node will hold for parameters, fp32 master weights, gradients,\n"
    "Adam state and staging buffers, and where each lives (device, host, nvme), for the ZeRO stage,\n"
    "offload settings and layout (hpZ, MiCS) of the config; then the bytes each node sends per optimizer\n"
    "step, within the node and to other nodes (with --ranks-per-node dividing --world-size). A pipelined\n"
    "config (pipeline.stages above 1) is planned per pipeline rank: its stages' units over its data-parallel\n"
    "group, the activations its schedule keeps in flight, the stage boundaries' bytes (pipeline_plan.hpp).\n"
    "MODEL.json\n"
    "is a Hugging Face Llama config.json or a unit list\n"
    "{\"units\": [{\"name\": \"layer.0\", \"params\": [[4096, 4096], [4096]]}, ...]}.\n"
    "--ranks-per-node defaults to --world-size (one node). --hidden-size resolves the config's \"auto\"\n"
    "bucket sizes (taken from a Llama config.json when not given). With a Llama config.json, --seq-len adds\n"
    "the activations per rank on the device as the Llama-3 example's kernels hold them for the config's\n"
    "micro-batch (the figure llama3_train --dry-run prints; activation checkpointing on unless\n"
    "--no-grad-checkpointing); --activation-bytes (K, M, G, T suffixes, powers of 1024) gives the figure\n"
    "instead. --micro-batch, --grad-accum and\n"
    "--precision resolve the matching \"auto\" values (an \"auto\" batch size left unset counts as 1: batch\n"
    "sizes do not change the plan). --lr resolves an \"auto\" learning rate (it changes nothing in the plan).\n"
    "\n"
    "       zero3 plan --model LLAMA_CONFIG.json --config DS_CONFIG.json --cluster CLUSTER.json --seq-len N\n"
    "                  [--micro-batch M] [--grad-accum G] [--precision bf16|fp16|fp32] [--lr X] [--steps S]\n"
    "                  [--layouts] [--measured SECONDS]\n"
    "\n"
    "Models one optimizer step of the config's stage-3 run on the cluster described in CLUSTER.json\n"
    "(configs/clusters/, docs/performance-model.md): compute, inter- and intra-node communication, PCIe\n"
    "offload copies and the optimizer, for DeepSpeed's plain ZeRO-3 data flow and for zero3's, side by side, and\n"
    "their time for S steps (default 1), as a range between two readings of what ZeRO-3's collectives lose on the\n"
    "network (a fraction of the bandwidth, a fixed cost per collective). The world is the cluster's nodes x\n"
    "gpus_per_node. --layouts adds zero3's step time under each layout (plain, hpZ and MiCS/HSDP over one node,\n"
    "MiCS over two nodes, with ZeRO++'s qwZ and qgZ) for the same job, flagging the rows the engine refuses.\n"
    "--measured SECONDS, the measured time of S steps of DeepSpeed's run of this job on this cluster, prints the\n"
    "model's error against it and the collective_efficiency and collective_overhead_ms that would meet it.\n"
    "A pipelined config is modelled as a pipeline: each pipeline rank's schedule step (compute, its ZeRO\n"
    "traffic, its stage-boundary transfers), the bubble and the optimizer boundary (pipeline_plan.hpp).\n"
    "\n"
    "       zero3 plan --advise --model LLAMA_CONFIG.json --config DS_CONFIG.json --cluster CLUSTER.json\n"
    "                  --seq-len N [--grad-checkpointing | --no-grad-checkpointing] [--activation-bytes BYTES]\n"
    "                  [--gpu-headroom BYTES] [--micro-batch M] [--grad-accum G] [--steps S] [--top K]\n"
    "                  [--write-config FILE [--pick N]] [--no-pipelines] [--precision bf16|fp16|fp32] [--lr X]\n"
    "\n"
    "Ranks every stage-3 layout zero3 runs on the cluster for this config and model: plain ZeRO-3, hpZ over\n"
    "each node, MiCS/HSDP over 1..N nodes (hierarchical where the group spans nodes), each with and without\n"
    "qwZ and qgZ and each offload (cpu; nvme when the config names an nvme_path), hpZ also with its secondary\n"
    "partition in host memory; and pipelined: 2, 4, ... stages across the nodes, 1f1b or interleaved_1f1b, ZeRO\n"
    "1-3 inside each stage, at the same global batch (more micro-batches), unless --no-pipelines; those that\n"
    "fit the cluster's\n"
    "GPU and host memory (gpu_memory_gib, host_memory_gib) ranked by predicted step time, each with the config\n"
    "edits that select it, its rank by each reading of the network alone, and what DeepSpeed refuses or\n"
    "changes in it; the ones that do not fit and the ones the engine refuses listed apart with the reason.\n"
    "Every plan counts the activations per GPU, estimated from the model, the micro-batch and --seq-len as\n"
    "the Llama-3 example's kernels hold them (the figure llama3_train --dry-run prints for the written config;\n"
    "activation checkpointing on, as llama3_train's default, unless --no-grad-checkpointing), or\n"
    "--activation-bytes; a layout fits only if its GPU keeps --gpu-headroom free (default 1G) beyond the plan\n"
    "and the cluster's gpu_reserved_gib. --top K prints the first K ranked (default: all); --write-config FILE\n"
    "writes the config of ranked row --pick N (default 1: the user's with the row's edits applied), never a\n"
    "layout that does not fit.\n";

std::optional<int64_t> parse_int(const std::string& s) {
  try {
    size_t pos = 0;
    long long v = std::stoll(s, &pos);
    if (pos != s.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<int64_t> parse_bytes(const std::string& s) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string suffix = s.substr(pos);
  if (suffix.ends_with("iB"))
    suffix.resize(suffix.size() - 2);
  else if (suffix.size() > 1 && suffix.ends_with("B"))
    suffix.resize(suffix.size() - 1);
  int shift = 0;
  if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (suffix == "T" || suffix == "t")
    shift = 40;
  else if (!suffix.empty() && suffix != "B")
    return std::nullopt;
  if (v < 0) return std::nullopt;
  return static_cast<int64_t>(v) << shift;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zero3 plan: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

struct ClusterRun {
  std::string model_path, config_path, cluster_path;
  int64_t seq_len = 0;
  int64_t steps = 1;
  bool layouts = false;
  size_t top = 0;
  std::string write_config;  // --advise: ranked row `pick`'s config goes here
  size_t pick = 1;
  std::optional<double> measured_s;
  std::optional<int64_t> activation_bytes;
  bool checkpointing = true;
  bool pipelines = true;  // --advise: rank pipelined layouts too (--no-pipelines: not)
  int64_t gpu_headroom_bytes = kDefaultGpuHeadroomBytes;
  std::optional<int64_t> hidden_size;
  ResolveInputs inputs;
};

// What the activations of the config's micro-batch are estimated for.
ActivationOptions activation_options(const Config& config, int64_t seq_len, bool checkpointing) {
  ActivationOptions act;
  act.micro_batch = *config.train_micro_batch_size_per_gpu;
  act.seq_len = seq_len;
  act.checkpointing = checkpointing;
  act.on_gpu = config.zero3.device != "cpu";
  act.compute = config.compute_dtype();
  act.grad_accum = config.grad_accum_dtype.value_or(DType::f32);
  return act;
}

// The model of a --cluster or --advise run: a Llama config.json, whose dimensions give the FLOPs.
ModelDesc load_llama(const std::string& path, const char* flag, int64_t* hidden, LlamaDims* dims) {
  ModelDesc model = load_model_desc(path, hidden, dims);
  if (dims->hidden_size == 0) {
    throw ConfigError(path + ": " + flag +
                      " needs a Hugging Face Llama config.json (its dimensions give the FLOPs), not a unit list");
  }
  return model;
}

// `zero3 plan --advise`: every layout for the config on the cluster, ranked (layout_advisor.hpp).
int run_advise(const ClusterRun& run) {
  int64_t model_hidden = 0;
  LlamaDims dims;
  const ModelDesc model = load_llama(run.model_path, "--advise", &model_hidden, &dims);
  ClusterDesc cluster = load_cluster_desc(run.cluster_path);
  AdviseOptions options;
  options.seq_len = run.seq_len;
  options.activation_bytes = run.activation_bytes;
  options.checkpointing = run.checkpointing;
  options.gpu_headroom_bytes = run.gpu_headroom_bytes;
  options.inputs = run.inputs;
  options.inputs.hidden_size = run.hidden_size.value_or(model_hidden);
  options.pipelines = run.pipelines;
  const std::string text = config_detail::read_config_file(run.config_path, kMaxConfigBytes);
  const Advice advice = advise_layouts(text, run.config_path, model, dims, cluster, options);
  std::printf("zero3 plan --advise: model %s (%s), %lld parameters; seq %lld\n", model.name.c_str(),
              run.model_path.c_str(), static_cast<long long>(model.numel()), static_cast<long long>(run.seq_len));
  std::printf("%s", format_advice(advice, cluster, run.steps, run.top).c_str());
  if (!run.write_config.empty()) {
    if (advice.ranked.empty()) {
      throw ConfigError("--write-config " + run.write_config + ": no layout fits this cluster, so nothing is written");
    }
    if (run.pick > advice.ranked.size()) {
      throw InvalidArgument("--pick " + std::to_string(run.pick) + ": only " + std::to_string(advice.ranked.size()) +
                            " layouts fit (ranked 1-" + std::to_string(advice.ranked.size()) +
                            "); the others do not fit or are refused, so nothing is written");
    }
    const AdvisedLayout& picked = advice.ranked[run.pick - 1];
    io::write_file_atomically(run.write_config, apply_config_edits(text, picked.edits, run.config_path) + "\n");
    std::printf("wrote %s: %s, ranked %zu (%zu edit%s of %s)\n", run.write_config.c_str(),
                picked.choice.describe(cluster.gpus_per_node, cluster.world()).c_str(), run.pick, picked.edits.size(),
                picked.edits.size() == 1 ? "" : "s", run.config_path.c_str());
    if (!picked.note.empty()) std::printf("note: %s\n", picked.note.c_str());
    if (!picked.deepspeed.empty()) {
      std::printf("note: DeepSpeed does not run this layout as written (see its row); zero3 does\n");
    }
  }
  return 0;
}

// `zero3 plan --cluster`: the step-time model of the config's run on the cluster, DeepSpeed's flow beside zero3's,
// and with --layouts zero3's flow under each layout.
int run_step_time(const ClusterRun& run) {
  int64_t model_hidden = 0;
  LlamaDims dims;
  const ModelDesc model = load_llama(run.model_path, "--cluster", &model_hidden, &dims);
  ClusterDesc cluster = load_cluster_desc(run.cluster_path);
  Config config = load_config(run.config_path);
  ResolveInputs inputs = run.inputs;
  inputs.world_size = cluster.world();
  inputs.hidden_size = run.hidden_size.value_or(model_hidden);
  resolve(config, inputs);
  const int64_t steps = run.steps;

  StepTimeOptions options;
  options.seq_len = run.seq_len;
  if (config.pipeline.stages.value_or(1) > 1) {
    if (run.layouts || run.measured_s) {
      throw ConfigError(run.config_path + ": pipeline.stages " + std::to_string(*config.pipeline.stages) +
                        ": --layouts and --measured model unpipelined runs; zero3 plan --advise ranks pipelined "
                        "layouts beside them");
    }
    const PipelineStepTime t = model_pipeline_step_time(model, dims, config, cluster, options);
    std::printf("model %s (%s): %lld parameters; config %s\ncluster %s (%s): %d nodes x %d GPUs\n", model.name.c_str(),
                run.model_path.c_str(), static_cast<long long>(model.numel()), run.config_path.c_str(),
                cluster.name.empty() ? "-" : cluster.name.c_str(), run.cluster_path.c_str(), cluster.nodes,
                cluster.gpus_per_node);
    std::printf("%s", format_pipeline_step_time(t, run.steps).c_str());
    if (const std::string refusal = engine_refusal(config, cluster); !refusal.empty()) {
      std::printf("zero3 refuses this config on this cluster: %s\n", refusal.c_str());
    }
    return 0;
  }
  options.flow = DataFlow::deepspeed;
  const StepTime deepspeed = model_step_time(model, dims, config, cluster, options);
  options.flow = DataFlow::zero3;
  const StepTime zero3 = model_step_time(model, dims, config, cluster, options);

  std::printf("model %s (%s): %lld parameters; config %s\n", model.name.c_str(), run.model_path.c_str(),
              static_cast<long long>(model.numel()), run.config_path.c_str());
  std::printf("cluster %s (%s): %d nodes x %d GPUs\n", cluster.name.empty() ? "-" : cluster.name.c_str(),
              run.cluster_path.c_str(), cluster.nodes, cluster.gpus_per_node);
  char flows[96] = "";
  if (cluster.flow_limit_gbit_s > 0) {
    std::snprintf(flows, sizeof flows, ", %d flows of %.4g Gbit/s", cluster.flows_per_node, cluster.flow_limit_gbit_s);
  }
  std::printf(
      "  node link %.4g Gbit/s (NIC %.4g Gbit/s%s) x NCCL %.2f x ZeRO-3 collectives %.4g = %.4g GB/s; PCIe "
      "%.4g GB/s per GPU; GPU %.4g TFLOP/s x %.2f\n",
      cluster.link_capacity_gbit_s(), cluster.nic_gbit_s, flows, cluster.nccl_link_efficiency,
      cluster.collective_efficiency, cluster.inter_node_gb_s(), cluster.pcie_effective_gb_s(), cluster.gpu_bf16_tflops,
      cluster.matmul_efficiency);
  if (cluster.collective_overhead_ms > 0) {
    std::printf("  or: node link at NCCL's %.4g GB/s plus %.4g ms per collective that crosses nodes\n",
                cluster.nccl_link_gb_s(), cluster.collective_overhead_ms);
  }
  std::printf("job: micro-batch %lld x seq %lld x grad-accum %lld per GPU, %s\n\n",
              static_cast<long long>(*config.train_micro_batch_size_per_gpu), static_cast<long long>(run.seq_len),
              static_cast<long long>(*config.gradient_accumulation_steps),
              config.compute_dtype() == DType::bf16  ? "bf16"
              : config.compute_dtype() == DType::f16 ? "fp16"
                                                     : "fp32");
  std::printf("%s", format_step_times({"DeepSpeed ZeRO-3", "zero3"}, {deepspeed, zero3}, steps).c_str());
  if (const std::string refusal = engine_refusal(config, cluster); !refusal.empty()) {
    std::printf("zero3 refuses this config on this cluster (its column is what the plan counts, not a run): %s\n",
                refusal.c_str());
  }
  if (run.measured_s) {
    const double n = static_cast<double>(steps);
    const NetworkFit fit = fit_network(model, dims, config, cluster, options, *run.measured_s / n);
    std::printf("\nmeasured: %lld steps of DeepSpeed's run in %.6g s (%.4g s a step)\n", static_cast<long long>(steps),
                *run.measured_s, fit.measured_step_s);
    auto error = [&](double modelled_step) { return (modelled_step / fit.measured_step_s - 1) * 100; };
    std::printf("  this description, bandwidth reading: %.6g s, %+.1f%%\n", fit.modelled.step_s * n,
                error(fit.modelled.step_s));
    if (fit.modelled.has_fixed_cost) {
      std::printf("  this description, fixed-cost reading: %.6g s, %+.1f%%\n", fit.modelled.step_fixed_s * n,
                  error(fit.modelled.step_fixed_s));
    }
    if (fit.collective_efficiency) {
      std::printf("  fit: collective_efficiency %.4g meets it (the bandwidth reading)\n", *fit.collective_efficiency);
    } else {
      std::printf("  fit: no collective_efficiency in (0, 1] meets it\n");
    }
    if (fit.collective_overhead_ms) {
      std::printf("  fit: collective_overhead_ms %.4g meets it (the fixed-cost reading, %lld collectives a step)\n",
                  *fit.collective_overhead_ms, static_cast<long long>(fit.modelled.inter_node_collectives));
    } else {
      std::printf("  fit: no collective_overhead_ms of 0 or more meets it\n");
    }
  }
  if (!run.layouts) return 0;

  struct Row {
    const char* name;
    int64_t hpz, mics;
    bool hierarchical, qwz, qgz;
  };
  const int64_t L = cluster.gpus_per_node;
  std::vector<Row> rows = {{"plain", 1, -1, false, false, false},
                           {"hpZ, one node", L, -1, false, false, false},
                           {"MiCS/HSDP, one node", 1, L, false, false, false},
                           {"plain + qwZ + qgZ", 1, -1, false, true, true},
                           {"hpZ + qwZ + qgZ (ZeRO++)", L, -1, false, true, true},
                           {"MiCS/HSDP + qgZ", 1, L, false, false, true}};
  if (cluster.nodes >= 4 && cluster.nodes % 2 == 0)
    rows.push_back({"MiCS, two nodes, hierarchical", 1, 2 * L, true, false, false});
  std::printf("\nzero3 per layout (the same job; qwZ int8 in blocks of %lld, qgZ int4 in blocks of %lld elements)\n",
              static_cast<long long>(config.zero3.qwz_block_size), static_cast<long long>(config.zero3.qgz_block_size));
  std::vector<std::string> names, notes, refusals;
  std::vector<StepTime> times;
  const bool fp32 = config.compute_dtype() == DType::f32;
  for (const Row& r : rows) {
    if (fp32 && (r.qwz || r.qgz)) continue;  // ZeRO++ quantizes 16-bit weights and gradients only
    Config c = config;
    c.zero.hpz_partition_size = r.hpz;
    c.zero.mics_shard_size = r.mics;
    c.zero.mics_hierarchical_params_gather = r.hierarchical;
    c.zero.quantized_weights = r.qwz;
    c.zero.quantized_gradients = r.qgz;
    names.push_back(r.name);
    times.push_back(model_step_time(model, dims, c, cluster, options));
    // The engine's verdict on the row's config, as zero3 plan --advise takes it.
    std::string refusal = engine_refusal(c, cluster);
    if (refusal.empty()) {
      notes.emplace_back();
      continue;
    }
    auto same = std::find(refusals.begin(), refusals.end(), refusal);
    if (same == refusals.end()) same = refusals.insert(refusals.end(), refusal);
    notes.push_back("refused (" + std::to_string(same - refusals.begin() + 1) + ")");
  }
  std::printf("%s", format_layout_table(names, times, deepspeed, steps, notes).c_str());
  for (size_t i = 0; i < refusals.size(); ++i) {
    std::printf("(%zu) the engine refuses this config: %s\n", i + 1, refusals[i].c_str());
  }
  if (!refusals.empty())
    std::printf("zero3 plan --advise ranks the layouts the engine runs, offload choices included\n");
  if (fp32) std::printf("(no qwZ/qgZ rows: the config computes in fp32, and ZeRO++ quantizes 16-bit training)\n");
  return 0;
}

}  // namespace

int run_plan(const Args& args) {
  std::string model_path, config_path;
  MemoryPlanOptions options;
  std::optional<int64_t> world_size, ranks_per_node, hidden_size, seq_len, steps, activation_bytes;
  std::string cluster_path;
  bool layouts = false, advise = false, no_pipelines = false;
  std::optional<int64_t> top, pick, gpu_headroom;
  std::optional<bool> checkpointing;
  std::string write_config;
  std::optional<double> measured;
  ResolveInputs inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a == "--layouts") {
      layouts = true;
      continue;
    }
    if (a == "--advise") {
      advise = true;
      continue;
    }
    if (a == "--no-pipelines") {
      no_pipelines = true;
      continue;
    }
    if (a == "--grad-checkpointing" || a == "--no-grad-checkpointing") {
      checkpointing = a == "--grad-checkpointing";
      continue;
    }
    if (i + 1 >= args.size()) return usage_error(a + " needs a value");
    const std::string& v = args[++i];
    auto positive = [&](std::optional<int64_t>& out) {
      out = parse_int(v);
      return out.has_value() && *out >= 1;
    };
    std::optional<int64_t> n;
    if (a == "--model") {
      model_path = v;
    } else if (a == "--config") {
      config_path = v;
    } else if (a == "--cluster") {
      cluster_path = v;
    } else if (a == "--seq-len") {
      if (!positive(seq_len)) return usage_error("--seq-len: expected a positive integer, got '" + v + "'");
    } else if (a == "--steps") {
      if (!positive(steps)) return usage_error("--steps: expected a positive integer, got '" + v + "'");
    } else if (a == "--write-config") {
      write_config = v;
    } else if (a == "--pick") {
      if (!positive(pick)) return usage_error("--pick: expected a ranked row, 1 or more, got '" + v + "'");
    } else if (a == "--gpu-headroom") {
      auto b = parse_bytes(v);
      if (!b) return usage_error("--gpu-headroom: expected a byte count such as 1G, got '" + v + "'");
      gpu_headroom = *b;
    } else if (a == "--top") {
      top = parse_int(v);
      if (!top || *top < 0) return usage_error("--top: expected a number of rows (0: all), got '" + v + "'");
    } else if (a == "--measured") {
      try {
        size_t pos = 0;
        measured = std::stod(v, &pos);
        if (pos != v.size() || !(*measured > 0) || !std::isfinite(*measured)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        return usage_error("--measured: expected a positive number of seconds, got '" + v + "'");
      }
    } else if (a == "--world-size") {
      if (!positive(world_size)) return usage_error("--world-size: expected a positive integer, got '" + v + "'");
    } else if (a == "--ranks-per-node") {
      if (!positive(ranks_per_node))
        return usage_error("--ranks-per-node: expected a positive integer, got '" + v + "'");
    } else if (a == "--hidden-size") {
      if (!positive(hidden_size)) return usage_error("--hidden-size: expected a positive integer, got '" + v + "'");
    } else if (a == "--micro-batch") {
      if (!positive(n)) return usage_error("--micro-batch: expected a positive integer, got '" + v + "'");
      inputs.micro_batch = n;
    } else if (a == "--grad-accum") {
      if (!positive(n)) return usage_error("--grad-accum: expected a positive integer, got '" + v + "'");
      inputs.grad_accum = n;
    } else if (a == "--activation-bytes") {
      auto b = parse_bytes(v);
      if (!b) return usage_error("--activation-bytes: expected a byte count such as 2G, got '" + v + "'");
      activation_bytes = *b;
    } else if (a == "--lr") {
      try {
        size_t pos = 0;
        inputs.lr = std::stod(v, &pos);
        if (pos != v.size()) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        return usage_error("--lr: expected a number, got '" + v + "'");
      }
    } else if (a == "--precision") {
      if (v == "bf16")
        inputs.precision = DType::bf16;
      else if (v == "fp16")
        inputs.precision = DType::f16;
      else if (v == "fp32")
        inputs.precision = DType::f32;
      else
        return usage_error("--precision: expected bf16, fp16 or fp32, got '" + v + "'");
    } else {
      return usage_error("unknown argument '" + a + "'");
    }
  }
  if (model_path.empty()) return usage_error("--model is required");
  if (config_path.empty()) return usage_error("--config is required");
  if (advise && cluster_path.empty()) return usage_error("--advise needs --cluster (the cluster description)");
  if (no_pipelines && !advise) return usage_error("--no-pipelines goes with --advise");
  if (!cluster_path.empty()) {
    if (world_size || ranks_per_node) {
      return usage_error(
          "--cluster sets the world (its nodes x gpus_per_node); drop --world-size and --ranks-per-node");
    }
    if (!seq_len) return usage_error("--cluster needs --seq-len (tokens per sequence)");
    if (!advise && !write_config.empty()) return usage_error("--write-config goes with --advise");
    if (pick && write_config.empty()) return usage_error("--pick goes with --write-config (the row it writes)");
    if (advise && (layouts || measured))
      return usage_error("--advise ranks every layout; drop --layouts and --measured");
    if (!advise && (activation_bytes || top || gpu_headroom || checkpointing)) {
      return usage_error(
          "--activation-bytes, --gpu-headroom, --grad-checkpointing and --top go with --advise (the step-time "
          "model counts no memory)");
    }
    if (activation_bytes && checkpointing) {
      return usage_error("--activation-bytes gives the figure; drop --" + std::string(*checkpointing ? "" : "no-") +
                         "grad-checkpointing, which estimates it");
    }
    ClusterRun run;
    run.model_path = model_path;
    run.config_path = config_path;
    run.cluster_path = cluster_path;
    run.seq_len = *seq_len;
    run.steps = steps.value_or(1);
    run.layouts = layouts;
    run.top = static_cast<size_t>(top.value_or(0));
    run.write_config = write_config;
    run.pick = static_cast<size_t>(pick.value_or(1));
    run.measured_s = measured;
    run.activation_bytes = activation_bytes;
    run.checkpointing = checkpointing.value_or(true);
    run.pipelines = !no_pipelines;
    run.gpu_headroom_bytes = gpu_headroom.value_or(kDefaultGpuHeadroomBytes);
    run.hidden_size = hidden_size;
    run.inputs = inputs;
    return advise ? run_advise(run) : run_step_time(run);
  }
  if (steps || layouts || top || measured || pick || gpu_headroom || !write_config.empty()) {
    return usage_error(
        "--steps, --layouts, --measured, --top, --gpu-headroom, --write-config and --pick go with --cluster");
  }
  if (!world_size) return usage_error("--world-size is required");
  if (checkpointing && !seq_len) return usage_error("--grad-checkpointing goes with --seq-len (the activations)");
  if (activation_bytes && seq_len) {
    return usage_error("--activation-bytes gives the activations and --seq-len estimates them; give one");
  }

  int64_t model_hidden = 0;
  LlamaDims dims;
  ModelDesc model = load_model_desc(model_path, &model_hidden, &dims);
  if (seq_len && dims.hidden_size == 0) {
    throw ConfigError(model_path +
                      ": --seq-len estimates the activations from a Hugging Face Llama config.json's "
                      "dimensions, and this is a unit list; give --activation-bytes instead");
  }
  Config config = load_config(config_path);
  inputs.world_size = *world_size;
  // Without --seq-len batch sizes change nothing in the plan, so an "auto" micro-batch the user did not give
  // resolves to 1 rather than stopping the plan; with it the micro-batch sizes the activations and must be known.
  if (!config.train_micro_batch_size_per_gpu && !inputs.micro_batch && !seq_len) inputs.micro_batch = 1;
  if (!config.gradient_accumulation_steps && !config.train_batch_size && !inputs.grad_accum) inputs.grad_accum = 1;
  if (hidden_size)
    inputs.hidden_size = *hidden_size;
  else if (model_hidden > 0)
    inputs.hidden_size = model_hidden;
  resolve(config, inputs);

  options.world_size = *world_size;
  options.ranks_per_node = ranks_per_node.value_or(*world_size);
  options.activation_bytes = activation_bytes.value_or(0);
  std::string activations_line;
  if (seq_len) {
    const ActivationOptions act = activation_options(config, *seq_len, checkpointing.value_or(true));
    options.activation_bytes = estimate_activations(dims, act).total();
    activations_line = "activations per rank: " + std::to_string(options.activation_bytes) + " bytes, micro-batch " +
                       std::to_string(act.micro_batch) + " x seq " + std::to_string(act.seq_len) +
                       ", activation checkpointing " + (act.checkpointing ? "on" : "off") +
                       " (as llama3_train --dry-run counts them)\n";
  } else if (!activation_bytes) {
    activations_line = "activations: not counted (give --seq-len with a Llama config.json, or --activation-bytes)\n";
  }
  if (config.pipeline.stages.value_or(1) > 1) {
    if (activation_bytes) {
      return usage_error(
          "--activation-bytes is one figure for every rank; a pipelined config's plan scales the "
          "estimate to each stage: give --seq-len instead");
    }
    PipelinePlanOptions po;
    po.world_size = options.world_size;
    po.ranks_per_node = options.ranks_per_node;
    if (seq_len) {
      po.boundary_numel = *config.train_micro_batch_size_per_gpu * *seq_len * dims.hidden_size;
      po.dims = dims;
      po.activations = estimate_activations(dims, activation_options(config, *seq_len, checkpointing.value_or(true)));
      po.checkpointing = checkpointing.value_or(true);
    }
    std::printf("model %s (%s), config %s\n", model.name.empty() ? "-" : model.name.c_str(), model_path.c_str(),
                config_path.c_str());
    if (!seq_len) {
      std::printf("activations and stage boundaries: not counted (give --seq-len with a Llama config.json)\n");
    } else {
      std::printf(
          "%spipelined: that estimate (the whole model, one micro-batch) scaled to each pipeline rank's "
          "layers and its micro-batches in flight\n",
          activations_line.c_str());
    }
    const PipelinePlan plan = plan_pipeline(model, config, po);
    std::printf("%s", format_pipeline_plan(plan).c_str());
    for (const PipelineRankPlan& r : plan.ranks) {
      std::printf("\npipeline rank %d, stages", r.rank);
      for (int s : r.stages) std::printf(" %d", s);
      std::printf(" (its data-parallel group: %lld ranks)\n%s", static_cast<long long>(plan.data_parallel),
                  format_memory_plan(r.memory).c_str());
    }
    return 0;
  }
  MemoryPlan plan = plan_memory(model, config, options);
  std::printf("model %s (%s), config %s\n", model.name.empty() ? "-" : model.name.c_str(), model_path.c_str(),
              config_path.c_str());
  std::printf("%s", activations_line.c_str());
  std::printf("%s", format_memory_plan(plan).c_str());
  if (options.world_size % options.ranks_per_node == 0) {
    TrafficPlanOptions t;
    t.world_size = options.world_size;
    t.ranks_per_node = options.ranks_per_node;
    std::printf("\n%s", format_traffic_plan(plan_traffic(model, config, t)).c_str());
  }
  return 0;
}

}  // namespace zero3::cli

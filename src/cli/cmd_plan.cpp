// `zero3 plan`: the dry-run memory plan of a model under a DeepSpeed config, per rank and per node, before
// anything is allocated; with --cluster, the modelled step time of the run on that cluster instead
// (step_time_model.hpp).
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/step_time_model.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::cli {
namespace {

constexpr const char* kUsage =
    "usage: zero3 plan --model MODEL.json --config DS_CONFIG.json --world-size N [--ranks-per-node K]\n"
    "                  [--hidden-size H] [--activation-bytes BYTES] [--micro-batch M] [--grad-accum G]\n"
    "                  [--precision bf16|fp16|fp32] [--lr X]\n"
    "\n"
    "Prints the bytes each rank and each node will hold for parameters, fp32 master weights, gradients,\n"
    "Adam state and staging buffers, and where each lives (device, host, nvme), for the ZeRO stage,\n"
    "offload settings and layout (hpZ, MiCS) of the config; then the bytes each node sends per optimizer\n"
    "step, within the node and to other nodes (with --ranks-per-node dividing --world-size). MODEL.json\n"
    "is a Hugging Face Llama config.json or a unit list\n"
    "{\"units\": [{\"name\": \"layer.0\", \"params\": [[4096, 4096], [4096]]}, ...]}.\n"
    "--ranks-per-node defaults to --world-size (one node). --hidden-size resolves the config's \"auto\"\n"
    "bucket sizes (taken from a Llama config.json when not given). --activation-bytes (K, M, G, T suffixes,\n"
    "powers of 1024) adds an activation estimate per rank on the device. --micro-batch, --grad-accum and\n"
    "--precision resolve the matching \"auto\" values (an \"auto\" batch size left unset counts as 1: batch\n"
    "sizes do not change the plan). --lr resolves an \"auto\" learning rate (it changes nothing in the plan).\n"
    "\n"
    "       zero3 plan --model LLAMA_CONFIG.json --config DS_CONFIG.json --cluster CLUSTER.json --seq-len N\n"
    "                  [--micro-batch M] [--grad-accum G] [--precision bf16|fp16|fp32] [--lr X] [--steps S]\n"
    "                  [--layouts]\n"
    "\n"
    "Models one optimizer step of the config's stage-3 run on the cluster described in CLUSTER.json\n"
    "(configs/clusters/, docs/performance-model.md): compute, inter- and intra-node communication, PCIe\n"
    "offload copies and the optimizer, for DeepSpeed's plain ZeRO-3 data flow and for zero3's, side by side, and\n"
    "their time for S steps (default 1). The world is the cluster's nodes x gpus_per_node. --layouts adds zero3's\n"
    "step time under each layout (plain, hpZ and MiCS/HSDP over one node, MiCS over two nodes, with ZeRO++'s\n"
    "qwZ and qgZ) for the same job.\n";

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

// `zero3 plan --cluster`: the step-time model of the config's run on the cluster, DeepSpeed's flow beside zero3's,
// and with --layouts zero3's flow under each layout.
int run_step_time(const std::string& model_path, const std::string& config_path, const std::string& cluster_path,
                  int64_t seq_len, int64_t steps, bool layouts, std::optional<int64_t> hidden_size,
                  ResolveInputs inputs) {
  int64_t model_hidden = 0;
  LlamaDims dims;
  ModelDesc model = load_model_desc(model_path, &model_hidden, &dims);
  if (dims.hidden_size == 0) {
    throw ConfigError(model_path +
                      ": --cluster needs a Hugging Face Llama config.json (its dimensions give the "
                      "FLOPs), not a unit list");
  }
  ClusterDesc cluster = load_cluster_desc(cluster_path);
  Config config = load_config(config_path);
  inputs.world_size = cluster.world();
  inputs.hidden_size = hidden_size.value_or(model_hidden);
  resolve(config, inputs);

  StepTimeOptions options;
  options.seq_len = seq_len;
  options.flow = DataFlow::deepspeed;
  const StepTime deepspeed = model_step_time(model, dims, config, cluster, options);
  options.flow = DataFlow::zero3;
  const StepTime zero3 = model_step_time(model, dims, config, cluster, options);

  std::printf("model %s (%s): %lld parameters; config %s\n", model.name.c_str(), model_path.c_str(),
              static_cast<long long>(model.numel()), config_path.c_str());
  std::printf("cluster %s (%s): %d nodes x %d GPUs\n", cluster.name.empty() ? "-" : cluster.name.c_str(),
              cluster_path.c_str(), cluster.nodes, cluster.gpus_per_node);
  char flows[96] = "";
  if (cluster.flow_limit_gbit_s > 0) {
    std::snprintf(flows, sizeof flows, ", %d flows of %.4g Gbit/s", cluster.flows_per_node, cluster.flow_limit_gbit_s);
  }
  std::printf(
      "  node link %.4g Gbit/s (NIC %.4g Gbit/s%s) x NCCL %.2f x ZeRO-3 collectives %.2f = %.4g GB/s; PCIe "
      "%.4g GB/s per GPU; GPU %.4g TFLOP/s x %.2f\n",
      cluster.link_capacity_gbit_s(), cluster.nic_gbit_s, flows, cluster.nccl_link_efficiency,
      cluster.collective_efficiency, cluster.inter_node_gb_s(), cluster.pcie_effective_gb_s(), cluster.gpu_bf16_tflops,
      cluster.matmul_efficiency);
  std::printf("job: micro-batch %lld x seq %lld x grad-accum %lld per GPU, %s\n\n",
              static_cast<long long>(*config.train_micro_batch_size_per_gpu), static_cast<long long>(seq_len),
              static_cast<long long>(*config.gradient_accumulation_steps),
              config.compute_dtype() == DType::bf16  ? "bf16"
              : config.compute_dtype() == DType::f16 ? "fp16"
                                                     : "fp32");
  std::printf("%s", format_step_times({"DeepSpeed ZeRO-3", "zero3"}, {deepspeed, zero3}, steps).c_str());
  if (!layouts) return 0;

  struct Row {
    const char* name;
    int64_t hpz, mics;
    bool hierarchical, qwz;
    int qgz_bits;
  };
  const int64_t L = cluster.gpus_per_node;
  std::vector<Row> rows = {{"plain", 1, -1, false, false, 0},
                           {"hpZ, one node", L, -1, false, false, 0},
                           {"MiCS/HSDP, one node", 1, L, false, false, 0},
                           {"plain + qwZ + qgZ *", 1, -1, false, true, 4},
                           {"hpZ + qwZ + qgZ (ZeRO++) *", L, -1, false, true, 4},
                           {"MiCS/HSDP + qgZ *", 1, L, false, false, 4}};
  if (cluster.nodes >= 4 && cluster.nodes % 2 == 0)
    rows.push_back({"MiCS, two nodes, hierarchical", 1, 2 * L, true, false, 0});
  std::printf("\nzero3 per layout (the same job; qgZ int4, qwZ int8, %lld-element blocks)\n",
              static_cast<long long>(options.quantization_block));
  std::vector<std::string> names;
  std::vector<StepTime> times;
  for (const Row& r : rows) {
    Config c = config;
    c.zero.hpz_partition_size = r.hpz;
    c.zero.mics_shard_size = r.mics;
    c.zero.mics_hierarchical_params_gather = r.hierarchical;
    StepTimeOptions o = options;
    o.quantized_weights = r.qwz;
    o.quantized_gradient_bits = r.qgz_bits;
    names.push_back(r.name);
    times.push_back(model_step_time(model, dims, c, cluster, o));
  }
  std::printf("%s", format_layout_table(names, times, deepspeed, steps).c_str());
  std::printf(
      "* the model's estimate of ZeRO++'s data flow: the engine does not issue qwZ and qgZ yet, so these bytes are\n"
      "  derived from the unquantized plan_traffic(), not counted by it\n");
  return 0;
}

}  // namespace

int run_plan(const Args& args) {
  std::string model_path, config_path;
  MemoryPlanOptions options;
  std::optional<int64_t> world_size, ranks_per_node, hidden_size, seq_len, steps;
  std::string cluster_path;
  bool layouts = false;
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
      options.activation_bytes = *b;
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
  if (!cluster_path.empty()) {
    if (world_size || ranks_per_node || options.activation_bytes > 0) {
      return usage_error(
          "--cluster sets the world (its nodes x gpus_per_node); drop --world-size, --ranks-per-node "
          "and --activation-bytes");
    }
    if (!seq_len) return usage_error("--cluster needs --seq-len (tokens per sequence)");
    return run_step_time(model_path, config_path, cluster_path, *seq_len, steps.value_or(1), layouts, hidden_size,
                         inputs);
  }
  if (seq_len || steps || layouts) return usage_error("--seq-len, --steps and --layouts go with --cluster");
  if (!world_size) return usage_error("--world-size is required");

  int64_t model_hidden = 0;
  ModelDesc model = load_model_desc(model_path, &model_hidden);
  Config config = load_config(config_path);
  inputs.world_size = *world_size;
  // Batch sizes change nothing in the plan (activations come from --activation-bytes), so an "auto" batch
  // the user did not give resolves to 1 rather than stopping the plan.
  if (!config.train_micro_batch_size_per_gpu && !inputs.micro_batch) inputs.micro_batch = 1;
  if (!config.gradient_accumulation_steps && !config.train_batch_size && !inputs.grad_accum) inputs.grad_accum = 1;
  if (hidden_size)
    inputs.hidden_size = *hidden_size;
  else if (model_hidden > 0)
    inputs.hidden_size = model_hidden;
  resolve(config, inputs);

  options.world_size = *world_size;
  options.ranks_per_node = ranks_per_node.value_or(*world_size);
  MemoryPlan plan = plan_memory(model, config, options);
  std::printf("model %s (%s), config %s\n", model.name.empty() ? "-" : model.name.c_str(), model_path.c_str(),
              config_path.c_str());
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

// `zero3 plan`: the dry-run memory plan of a model under a DeepSpeed config, per rank and per node, before
// anything is allocated.
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::cli {
namespace {

constexpr const char* kUsage =
    "usage: zero3 plan --model MODEL.json --config DS_CONFIG.json --world-size N [--ranks-per-node K]\n"
    "                  [--hidden-size H] [--activation-bytes BYTES] [--micro-batch M] [--grad-accum G]\n"
    "                  [--precision bf16|fp16|fp32]\n"
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
    "sizes do not change the plan).\n";

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

}  // namespace

int run_plan(const Args& args) {
  std::string model_path, config_path;
  MemoryPlanOptions options;
  std::optional<int64_t> world_size, ranks_per_node, hidden_size;
  ResolveInputs inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
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

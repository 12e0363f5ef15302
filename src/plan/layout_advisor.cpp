#include "zero3/layout_advisor.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <utility>

#include "config/config_checks.hpp"
#include "config/json_text.hpp"
#include "core/check.hpp"
#include "zero/resolved_config.hpp"
#include "zero/topology.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using nlohmann::json;

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  std::stringstream in(path);
  for (std::string key; std::getline(in, key, '.');) keys.push_back(key);
  return keys;
}

// The value at a dotted path, or nullptr.
const json* find_path(const json& root, const std::string& path) {
  const json* at = &root;
  for (const std::string& key : split_path(path)) {
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
  }
  return at;
}

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

// The edits that take the user's config (`user`, read from `raw`) to `want`. A key whose wanted value is its
// default ("off") is removed where the user's file has it; an offload is set as a whole section unless the file
// already has one, whose other fields (buffers, pin_memory) are kept.
std::vector<ConfigEdit> edits_for(const LayoutChoice& want, const Config& user, const json& raw,
                                  const std::string& nvme_path) {
  std::vector<ConfigEdit> edits;
  const ZeroConfig& z = user.zero;
  auto set_or_remove = [&](const std::string& key, bool same, bool off, const std::string& value) {
    if (same) return;
    const std::string path = "zero_optimization." + key;
    if (off) {
      if (find_path(raw, path) != nullptr) edits.push_back({path, std::nullopt});
      return;
    }
    edits.push_back({path, value});
  };
  set_or_remove(
      "zero_hpz_partition_size",
      z.hpz_partition_size == want.hpz_partition_size || (z.hpz_partition_size <= 1 && want.hpz_partition_size <= 1),
      want.hpz_partition_size <= 1, std::to_string(want.hpz_partition_size));
  set_or_remove("mics_shard_size",
                z.mics_shard_size == want.mics_shard_size || (z.mics_shard_size <= 0 && want.mics_shard_size <= 0),
                want.mics_shard_size <= 0, std::to_string(want.mics_shard_size));
  set_or_remove("mics_hierarchical_params_gather", z.mics_hierarchical_params_gather == want.hierarchical,
                !want.hierarchical, "true");
  set_or_remove("zero_quantized_weights", z.quantized_weights == want.qwz, !want.qwz, "true");
  set_or_remove("zero_quantized_gradients", z.quantized_gradients == want.qgz, !want.qgz, "true");

  auto offload = [&](const std::string& key, const std::string& alias, const OffloadConfig& current,
                     OffloadDevice wanted) {
    if (current.device == wanted) return;
    const std::string path = "zero_optimization." + key, alias_path = "zero_optimization." + alias;
    // The deprecated boolean form (cpu_offload, cpu_offload_param) goes whatever replaces it.
    if (find_path(raw, alias_path) != nullptr) edits.push_back({alias_path, std::nullopt});
    const json* section = find_path(raw, path);
    if (wanted == OffloadDevice::none) {
      if (section != nullptr) edits.push_back({path, std::nullopt});
      return;
    }
    const bool nvme = wanted == OffloadDevice::nvme;
    if (section != nullptr && section->is_object()) {
      edits.push_back({path + ".device", json(device_name(wanted)).dump()});
      if (nvme && !section->contains("nvme_path")) edits.push_back({path + ".nvme_path", json(nvme_path).dump()});
      return;
    }
    json value = {{"device", device_name(wanted)}};
    if (nvme) value["nvme_path"] = nvme_path;
    value["pin_memory"] = true;
    edits.push_back({path, value.dump()});
  };
  offload("offload_optimizer", "cpu_offload", z.offload_optimizer, want.offload_optimizer);
  offload("offload_param", "cpu_offload_param", z.offload_param, want.offload_param);
  if (user.zero3.hpz_secondary_on_host != want.secondary_on_host) {
    if (want.secondary_on_host) {
      edits.push_back({"zero3.hpz_secondary_memory", json("host").dump()});
    } else if (find_path(raw, "zero3.hpz_secondary_memory") != nullptr) {
      edits.push_back({"zero3.hpz_secondary_memory", std::nullopt});
    }
  }
  return edits;
}

LayoutChoice choice_of(const Config& c) {
  LayoutChoice l;
  l.hpz_partition_size = std::max<int64_t>(c.zero.hpz_partition_size, 1);
  l.mics_shard_size = c.zero.mics_shard_size > 0 ? c.zero.mics_shard_size : -1;
  l.hierarchical = c.zero.mics_hierarchical_params_gather;
  l.qwz = c.zero.quantized_weights;
  l.qgz = c.zero.quantized_gradients;
  l.offload_optimizer = c.zero.offload_optimizer.device;
  l.offload_param = c.zero.offload_param.device;
  l.secondary_on_host = c.zero.hpz_partition_size > 1 && c.zero3.hpz_secondary_on_host;
  return l;
}

// Every layout of the header's list on `nodes` x `per_node`, with `offloads` for each offload key.
std::vector<LayoutChoice> enumerate(int64_t nodes, int64_t per_node, const std::vector<OffloadDevice>& offloads) {
  struct Shape {
    int64_t hpz, mics;
    bool hierarchical;
  };
  std::vector<Shape> shapes = {{1, -1, false}};
  if (nodes >= 2 && per_node >= 2) shapes.push_back({per_node, -1, false});  // groups of 1: no secondary partition
  for (int64_t k = 1; k <= nodes; ++k) {
    if (nodes % k != 0) continue;
    if (k < nodes) shapes.push_back({1, k * per_node, false});
    if (k >= 2) shapes.push_back({1, k * per_node, true});
  }
  std::vector<LayoutChoice> out;
  for (const Shape& s : shapes) {
    for (int q = 0; q < 4; ++q) {
      for (OffloadDevice opt : offloads) {
        for (OffloadDevice param : offloads) {
          LayoutChoice l;
          l.hpz_partition_size = s.hpz;
          l.mics_shard_size = s.mics;
          l.hierarchical = s.hierarchical;
          l.qwz = (q & 1) != 0;
          l.qgz = (q & 2) != 0;
          l.offload_optimizer = opt;
          l.offload_param = param;
          out.push_back(l);
          if (s.hpz > 1) {  // hpZ's secondary partition in host memory, for a GPU that cannot hold it
            l.secondary_on_host = true;
            out.push_back(l);
          }
        }
      }
    }
  }
  return out;
}

// Resolving each candidate would log the same "auto" notes and warnings as the user's config did once: quiet.
class QuietLog {
 public:
  QuietLog() : saved_(log::level()) { log::set_level(LogLevel::error); }
  ~QuietLog() { log::set_level(saved_); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  LogLevel saved_;
};

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30));
  return buf;
}

}  // namespace

std::string ConfigEdit::text() const { return path + ": " + (value ? *value : std::string("removed")); }

std::string apply_config_edits(const std::string& json_text, const std::vector<ConfigEdit>& edits,
                               const std::string& source) {
  json root = config_detail::parse_json_text(json_text, source);
  ZERO3_REQUIRE(root.is_object(), ConfigError, source, ": the top level must be a JSON object {...}");
  for (const ConfigEdit& e : edits) {
    const std::vector<std::string> keys = split_path(e.path);
    ZERO3_REQUIRE(!keys.empty(), ConfigError, source, ": an edit with an empty key path");
    json* at = &root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      if (!at->contains(keys[i])) {
        if (!e.value) break;  // removing a key under an absent object: nothing to do
        (*at)[keys[i]] = json::object();
      }
      at = &(*at)[keys[i]];
      ZERO3_REQUIRE(at->is_object(), ConfigError, source, ": ", e.path, ": ", keys[i], " is ", at->type_name(),
                    ", not an object, so the edit cannot go under it");
    }
    if (!e.value) {
      if (at->is_object()) at->erase(keys.back());
      continue;
    }
    try {
      (*at)[keys.back()] = json::parse(*e.value);
    } catch (const json::exception& x) {
      throw ConfigError(source + ": " + e.path + ": the edit's value " + *e.value + " is not JSON: " + x.what());
    }
  }
  return root.dump(4);
}

std::string engine_refusal(const Config& config, const ClusterDesc& cluster) {
  try {
    detail::require_resolved(config, cluster.world());
    config_detail::check_layouts(config);
    config_detail::check_quantization_precision(config);
    detail::make_shard_layout(
        config.zero, detail::make_node_layout(
                         cluster.world(), cluster.gpus_per_node,
                         (cluster.source.empty() ? std::string("the cluster") : cluster.source) + ": gpus_per_node"));
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const Unsupported& e) {
    return e.what();
  }
  return "";
}

std::string LayoutChoice::layout(int64_t gpus_per_node) const {
  auto group = [&](int64_t ranks) {
    if (ranks % gpus_per_node != 0) return "groups of " + std::to_string(ranks) + " ranks";
    const int64_t k = ranks / gpus_per_node;
    return k == 1 ? std::string("one node") : std::to_string(k) + " nodes";
  };
  std::string s = hpz_partition_size > 1 ? std::string(secondary_on_host ? "hpZ/host, " : "hpZ, ") + group(hpz_partition_size)
                  : mics_shard_size > 0  ? std::string(mics_shard_size == gpus_per_node ? "MiCS/HSDP, " : "MiCS, ") +
                                              group(mics_shard_size) + (hierarchical ? ", hierarchical" : "")
                                        : std::string("ZeRO-3");
  if (qwz) s += " + qwZ";
  if (qgz) s += " + qgZ";
  return s;
}

std::string LayoutChoice::describe(int64_t gpus_per_node) const {
  const std::string s = layout(gpus_per_node);
  if (offload_optimizer == OffloadDevice::none && offload_param == OffloadDevice::none) return s + "; no offload";
  return s + "; offload optimizer " + device_name(offload_optimizer) + ", parameters " + device_name(offload_param);
}

Advice advise_layouts(const std::string& config_json, const std::string& config_source, const ModelDesc& model,
                      const LlamaDims& dims, const ClusterDesc& cluster, const AdviseOptions& options) {
  ZERO3_REQUIRE(options.seq_len >= 1, InvalidArgument, "advise_layouts: seq_len ", options.seq_len,
                " must be at least 1");
  ZERO3_REQUIRE(options.activation_bytes >= 0, InvalidArgument, "advise_layouts: activation_bytes ",
                options.activation_bytes, " must be >= 0");
  require_memory_figures(cluster, "zero3 plan --advise");
  ResolveInputs inputs = options.inputs;
  inputs.world_size = cluster.world();

  // The user's config as it is: it must read and resolve for this world, or no edit of it will.
  const json raw = config_detail::parse_json_text(config_json, config_source);
  Config user = parse_config(config_json, config_source);
  resolve(user, inputs);
  ZERO3_REQUIRE(user.zero.stage == 3, ConfigError, "zero_optimization.stage: ", user.zero.stage, " (in ", config_source,
                "); zero3 plan --advise ranks the layouts of stage 3, which gathers parameters every micro-step");
  std::string nvme_path = user.zero.offload_param.nvme_path;
  if (nvme_path.empty()) nvme_path = user.zero.offload_optimizer.nvme_path;
  std::vector<OffloadDevice> offloads = {OffloadDevice::none, OffloadDevice::cpu};
  if (!nvme_path.empty()) offloads.push_back(OffloadDevice::nvme);

  std::vector<LayoutChoice> choices = enumerate(cluster.nodes, cluster.gpus_per_node, offloads);
  const LayoutChoice as_is = choice_of(user);
  if (std::none_of(choices.begin(), choices.end(), [&](const LayoutChoice& c) { return c == as_is; })) {
    choices.push_back(as_is);  // the user's own layout, outside the list: ranked beside it
  }

  Advice advice;
  advice.config_source = config_source;
  advice.gpu_plan_bytes = cluster.gpu_plan_bytes();
  advice.host_plan_bytes = cluster.host_plan_bytes();
  advice.activation_bytes = options.activation_bytes;
  MemoryPlanOptions memory;
  memory.world_size = cluster.world();
  memory.ranks_per_node = cluster.gpus_per_node;
  memory.activation_bytes = options.activation_bytes;
  StepTimeOptions timing;
  timing.seq_len = options.seq_len;

  QuietLog quiet;
  for (const LayoutChoice& choice : choices) {
    AdvisedLayout a;
    a.choice = choice;
    a.edits = edits_for(choice, user, raw, nvme_path);
    a.is_user_config = a.edits.empty();
    Config c;
    try {
      c = parse_config(apply_config_edits(config_json, a.edits, config_source), config_source + " with the edits");
      resolve(c, inputs);
    } catch (const ConfigError& e) {
      a.reason = std::string("zero3 config check: ") + e.what();
      advice.refused.push_back(std::move(a));
      continue;
    }
    a.reason = engine_refusal(c, cluster);
    if (!a.reason.empty()) {
      advice.refused.push_back(std::move(a));
      continue;
    }
    const MemoryPlan plan = plan_memory(model, c, memory);
    a.gpu_bytes = plan.device_is_host ? 0 : plan.rank_bytes(MemoryTier::device);
    a.host_node_bytes =
        plan.node_bytes(MemoryTier::host) + (plan.device_is_host ? plan.node_bytes(MemoryTier::device) : 0);
    a.nvme_node_bytes = plan.node_bytes(MemoryTier::nvme);
    if (a.gpu_bytes > advice.gpu_plan_bytes) {
      a.reason = "GPU " + gib(a.gpu_bytes) + " > " + gib(advice.gpu_plan_bytes);
    }
    if (a.host_node_bytes > advice.host_plan_bytes) {
      a.reason += (a.reason.empty() ? "" : "; ") + std::string("host ") + gib(a.host_node_bytes) + " per node > " +
                  gib(advice.host_plan_bytes);
    }
    if (!a.reason.empty()) {
      a.verdict = Verdict::does_not_fit;
      advice.not_fitting.push_back(std::move(a));
      continue;
    }
    a.verdict = Verdict::ranked;
    a.time = model_step_time(model, dims, c, cluster, timing);
    advice.ranked.push_back(std::move(a));
  }
  std::stable_sort(advice.ranked.begin(), advice.ranked.end(), [](const AdvisedLayout& a, const AdvisedLayout& b) {
    return std::tuple(a.time.step_high_s(), a.time.step_low_s(), a.edits.size(), a.gpu_bytes) <
           std::tuple(b.time.step_high_s(), b.time.step_low_s(), b.edits.size(), b.gpu_bytes);
  });
  for (size_t i = 0; i < advice.ranked.size(); ++i) {
    if (advice.ranked[i].is_user_config) advice.user_config_rank = i;
  }
  return advice;
}

std::string format_advice(const Advice& advice, const ClusterDesc& cluster, int64_t steps, size_t top) {
  std::ostringstream out;
  char buf[512];
  const size_t total = advice.ranked.size() + advice.not_fitting.size() + advice.refused.size();
  out << total << " layouts of " << advice.config_source << " on " << (cluster.name.empty() ? "-" : cluster.name)
      << " (" << cluster.source << "), " << cluster.nodes << " nodes x " << cluster.gpus_per_node
      << " GPUs: " << advice.ranked.size() << " ranked, " << advice.not_fitting.size() << " do not fit, "
      << advice.refused.size() << " refused\n";
  std::snprintf(buf, sizeof buf,
                "memory a plan may use: %s per GPU (gpu_memory_gib %.4g - gpu_reserved_gib %.4g), %s of host memory "
                "per node (host_memory_gib %.4g - host_reserved_gib %.4g); activations %s per GPU%s\n",
                gib(advice.gpu_plan_bytes).c_str(), cluster.gpu_memory_gib, cluster.gpu_reserved_gib,
                gib(advice.host_plan_bytes).c_str(), cluster.host_memory_gib, cluster.host_reserved_gib,
                gib(advice.activation_bytes).c_str(),
                advice.activation_bytes > 0 ? " (--activation-bytes)" : " (not counted: give --activation-bytes)");
  out << buf;
  if (cluster.collective_overhead_ms > 0) {
    std::snprintf(buf, sizeof buf,
                  "step: the range between the network read as a bandwidth loss (collective_efficiency %.4g) and as "
                  "a fixed cost per collective that crosses nodes (collective_overhead_ms %.4g); ranked by its high "
                  "end\n",
                  cluster.collective_efficiency, cluster.collective_overhead_ms);
  } else {
    std::snprintf(buf, sizeof buf,
                  "step: one reading of the network (collective_efficiency %.4g; the cluster description has no "
                  "collective_overhead_ms for the other)\n",
                  cluster.collective_efficiency);
  }
  out << buf;
  out << "hpZ/host: hpZ with its secondary partition in pinned host memory (zero3.hpz_secondary_memory \"host\")\n\n";

  const std::string steps_header = std::to_string(steps) + " steps";
  std::snprintf(buf, sizeof buf, "%5s  %-40s %-9s %-10s %10s %10s %15s %15s  %s\n", "rank", "layout", "optimizer",
                "parameters", "GPU", "host/node", "step, low-high", steps_header.c_str(), "bound");
  out << buf;
  const size_t shown = top == 0 ? advice.ranked.size() : std::min(top, advice.ranked.size());
  const double n = static_cast<double>(steps);
  for (size_t i = 0; i < shown; ++i) {
    const AdvisedLayout& a = advice.ranked[i];
    const StepTime& t = a.time;
    const std::string rank = std::to_string(i + 1) + (a.is_user_config ? "*" : "");
    auto where = [](OffloadDevice d) { return d == OffloadDevice::none ? "GPU" : device_name(d); };
    std::snprintf(buf, sizeof buf, "%5s  %-40s %-9s %-10s %10s %10s %15s %15s  %s\n", rank.c_str(),
                  a.choice.layout(cluster.gpus_per_node).c_str(), where(a.choice.offload_optimizer),
                  where(a.choice.offload_param), gib(a.gpu_bytes).c_str(), gib(a.host_node_bytes).c_str(),
                  format_seconds_range(t.step_low_s(), t.step_high_s()).c_str(),
                  format_seconds_range(t.step_low_s() * n, t.step_high_s() * n).c_str(), t.bound.c_str());
    out << buf;
    std::string edits;
    for (const ConfigEdit& e : a.edits) edits += (edits.empty() ? "" : ", ") + e.text();
    out << "       edits: " << (edits.empty() ? "none (your config as it is)" : edits) << '\n';
  }
  if (shown < advice.ranked.size()) {
    out << "       ... " << advice.ranked.size() - shown << " more ranked (--top 0 prints them all)\n";
  }
  if (advice.user_config_rank) {
    out << "* your config as it is: rank " << *advice.user_config_rank + 1 << '\n';
  }
  if (!advice.ranked.empty()) {
    // Rows whose range reaches the top row's: the model cannot tell them apart from it. Listed as runs of ranks.
    const double best_high = advice.ranked.front().time.step_high_s();
    std::string ranks;
    for (size_t i = 1; i < advice.ranked.size(); ++i) {
      if (advice.ranked[i].time.step_low_s() > best_high) continue;
      size_t last = i;
      while (last + 1 < advice.ranked.size() && advice.ranked[last + 1].time.step_low_s() <= best_high) ++last;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(i + 1) +
               (last > i ? "-" + std::to_string(last + 1) : std::string());
      i = last;
    }
    if (!ranks.empty()) {
      out << "ranks " << ranks << " reach into rank 1's range: the model does not separate them from it\n";
    }
  }
  if (std::any_of(advice.ranked.begin(), advice.ranked.end(),
                  [](const AdvisedLayout& a) { return a.nvme_node_bytes > 0; })) {
    out << "NVMe space is not checked: the cluster description has no NVMe capacity\n";
  }
  out << "\ndo not fit (never ranked): " << advice.not_fitting.size() << '\n';
  for (const AdvisedLayout& a : advice.not_fitting) {
    out << "  " << a.choice.describe(cluster.gpus_per_node) << (a.is_user_config ? " (your config)" : "") << ": "
        << a.reason << '\n';
  }
  // Refused layouts by reason: most share one.
  out << "\nrefused (never ranked): " << advice.refused.size() << '\n';
  std::vector<std::string> reasons;
  for (const AdvisedLayout& a : advice.refused) {
    if (std::find(reasons.begin(), reasons.end(), a.reason) == reasons.end()) reasons.push_back(a.reason);
  }
  for (const std::string& reason : reasons) {
    out << "  " << reason << '\n';
    for (const AdvisedLayout& a : advice.refused) {
      if (a.reason != reason) continue;
      out << "    " << a.choice.describe(cluster.gpus_per_node) << (a.is_user_config ? " (your config)" : "") << '\n';
    }
  }
  return out.str();
}

}  // namespace zero3

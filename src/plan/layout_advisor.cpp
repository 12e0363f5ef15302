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
#include "plan/advisor_pipeline.hpp"
#include "plan/stage_group_nodes.hpp"
#include "zero/resolved_config.hpp"
#include "zero/topology.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/pipeline_plan.hpp"

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

// The pipeline's keys and the ZeRO stage inside it (LayoutChoice's pipeline fields): a key set to its default is
// removed where the file has it, else left out. The batch of a pipelined row is edited apart (advise_layouts).
void pipeline_edits(const LayoutChoice& want, const Config& user, const json& raw, std::vector<ConfigEdit>& edits) {
  auto key = [&](const std::string& path, bool same, bool is_default, const std::string& value) {
    if (same) return;
    if (is_default && find_path(raw, path) != nullptr) {
      edits.push_back({path, std::nullopt});
    } else if (!is_default || find_path(raw, path) == nullptr) {
      edits.push_back({path, value});
    }
  };
  const int64_t stages = user.pipeline.stages.value_or(1);
  if (want.zero_stage != user.zero.stage) edits.push_back({"zero_optimization.stage", std::to_string(want.zero_stage)});
  if (want.pipeline_stages != stages) {
    if (want.pipeline_stages == 1 && find_path(raw, "pipeline.stages") != nullptr) {
      edits.push_back({"pipeline.stages", std::nullopt});
    } else if (want.pipeline_stages > 1) {
      edits.push_back({"pipeline.stages", std::to_string(want.pipeline_stages)});
    }
  }
  if (want.pipeline_stages == 1) return;  // the schedule keys of an unpipelined row stay as the user has them
  key("zero3.pipeline_schedule", want.pipeline_schedule == user.zero3.pipeline_schedule,
      want.pipeline_schedule == "1f1b", json(want.pipeline_schedule).dump());
  key("zero3.pipeline_virtual_stages", want.virtual_stages == user.zero3.pipeline_virtual_stages,
      want.virtual_stages == 1, std::to_string(want.virtual_stages));
  key("zero3.pipeline_stage_order", want.stage_order == user.zero3.pipeline_stage_order,
      want.stage_order == "stages_across_nodes", json(want.stage_order).dump());
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
  pipeline_edits(want, user, raw, edits);
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
  l.pipeline_stages = c.pipeline.stages.value_or(1);
  l.zero_stage = c.zero.stage;
  if (l.pipeline_stages > 1) {
    l.pipeline_schedule = c.zero3.pipeline_schedule;
    l.virtual_stages = c.zero3.pipeline_virtual_stages;
    l.stage_order = c.zero3.pipeline_stage_order;
  }
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

// The pipelined layouts of the header's list on a world of `world` ranks for a model of `units` units.
std::vector<LayoutChoice> enumerate_pipelined(int64_t world, int64_t units,
                                              const std::vector<OffloadDevice>& offloads) {
  std::vector<LayoutChoice> out;
  for (int64_t stages = 2; stages <= world; stages *= 2) {
    if (world % stages != 0 || stages > units) continue;
    for (int64_t virtual_stages : {1, 2}) {
      if (stages * virtual_stages > units) continue;
      for (int zero_stage = 1; zero_stage <= 3; ++zero_stage) {
        for (OffloadDevice opt : offloads) {
          for (OffloadDevice param : offloads) {
            if (zero_stage < 3 && param != OffloadDevice::none) continue;  // parameter offload needs stage 3
            LayoutChoice l;
            l.pipeline_stages = stages;
            l.virtual_stages = virtual_stages;
            l.pipeline_schedule = virtual_stages > 1 ? "interleaved_1f1b" : "1f1b";
            l.zero_stage = zero_stage;
            l.offload_optimizer = opt;
            l.offload_param = param;
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

// 1-based ranks of `rows` by `key` (ties keep the ranking's order).
template <typename Key>
std::vector<size_t> ranks_by(const std::vector<AdvisedLayout>& rows, Key key) {
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(rows[a]) < key(rows[b]); });
  std::vector<size_t> rank(rows.size());
  for (size_t r = 0; r < order.size(); ++r) rank[order[r]] = r + 1;
  return rank;
}

bool ranks_before(const AdvisedLayout& a, const AdvisedLayout& b) {
  return std::tuple(a.time.step_high_s(), a.time.step_low_s(), a.edits.size(), a.gpu_bytes) <
         std::tuple(b.time.step_high_s(), b.time.step_low_s(), b.edits.size(), b.gpu_bytes);
}

// The step of a config's layout: pipelined or not.
StepTime time_layout(const ModelDesc& model, const LlamaDims& dims, const Config& config, const ClusterDesc& cluster,
                     const StepTimeOptions& timing) {
  if (config.pipeline.stages.value_or(1) > 1)
    return model_pipeline_step_time(model, dims, config, cluster, timing).time;
  return model_step_time(model, dims, config, cluster, timing);
}

// The ranking's first row with every ranked layout re-timed at `overhead_ms` per cross-node collective.
size_t first_at_overhead(const Advice& advice, const ModelDesc& model, const LlamaDims& dims, ClusterDesc cluster,
                         const StepTimeOptions& timing, double overhead_ms) {
  cluster.collective_overhead_ms = overhead_ms;
  std::vector<AdvisedLayout> rows;
  rows.reserve(advice.ranked.size());
  for (const AdvisedLayout& a : advice.ranked) {
    AdvisedLayout r;
    r.edits = a.edits;
    r.gpu_bytes = a.gpu_bytes;
    r.time = time_layout(model, dims, a.config, cluster, timing);
    rows.push_back(std::move(r));
  }
  size_t best = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (ranks_before(rows[i], rows[best])) best = i;
  }
  return best;
}

}  // namespace

std::vector<DeepSpeedDifference> deepspeed_differences(const LayoutChoice& c, int64_t world) {
  std::vector<DeepSpeedDifference> out;
  const bool mics = c.mics_shard_size > 0;
  if (mics && c.mics_shard_size < world && c.offload_optimizer != OffloadDevice::none) {
    out.push_back({true,
                   "refuses MiCS with replicas and offload_optimizer (\"Local sharding has no support for CPU "
                   "offloading\", at the first optimizer step)",
                   "runtime/zero/mics.py, MiCS_Optimizer.allreduce_mics_shard_grads: the gradient partitions to "
                   "all-reduce across replicas are in host memory"});
  }
  if (mics && c.qwz) {
    out.push_back({false, "drops qwZ under MiCS silently (gathers in the compute dtype)",
                   "runtime/zero/mics.py, MiCS_Init: its all_gather_coalesced never quantizes; runtime/engine.py "
                   "_return_mics_optimizer passes no zero_quantized_weights"});
  }
  if (mics && c.qgz) {
    out.push_back({false, "drops qgZ under MiCS silently (reduce-scatter in communication_data_type)",
                   "runtime/engine.py _return_mics_optimizer passes no all2all_process_group, without which "
                   "runtime/zero/stage3.py never calls all_to_all_quant_reduce"});
  }
  if (c.hpz_partition_size > 1 && c.offload_param == OffloadDevice::cpu && !c.secondary_on_host) {
    out.push_back({false, "keeps hpZ's secondary partition in host memory with offload_param cpu (zero3's hpZ/host)",
                   "runtime/zero/partition_parameters.py, Init._partition_param_sec: the secondary tensor is "
                   "allocated on the offload device"});
  }
  if (c.hpz_partition_size > 1 && c.offload_param == OffloadDevice::nvme) {
    out.push_back({true, "has no NVMe place for hpZ's secondary partition with offload_param nvme",
                   "runtime/zero/partition_parameters.py, Init._partition_param_sec: torch.empty on device \"nvme\", "
                   "which is no torch device (read in the source, not run)"});
  }
  if (c.pipeline_stages > 1 && c.zero_stage >= 2) {
    out.push_back({true,
                   "refuses ZeRO-2 and ZeRO-3 inside a pipeline (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                   "parallelism\")",
                   "runtime/pipe/engine.py, PipelineEngine.__init__: assert zero_optimization_stage() < 2"});
  }
  if (c.pipeline_stages > 1 && c.pipeline_schedule != "1f1b") {
    out.push_back({true, "has no " + c.pipeline_schedule + " schedule (its pipeline engine runs 1F1B only)",
                   "runtime/pipe/schedule.py: TrainSchedule, the schedule runtime/pipe/engine.py train_batch runs"});
  }
  if (c.hpz_partition_size > 1 && c.secondary_on_host && c.offload_param == OffloadDevice::none) {
    out.push_back({false, "keeps hpZ's secondary partition on the GPU (zero3.hpz_secondary_memory is zero3's key)",
                   "runtime/zero/partition_parameters.py, Init._partition_param_sec: on the offload device, which "
                   "is the GPU without offload_param"});
  }
  return out;
}

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
    const std::string source = (cluster.source.empty() ? std::string("the cluster") : cluster.source);
    const int64_t stages = config.pipeline.stages.value_or(1);
    if (stages > 1) {
      // As the pipeline engine makes each stage's Engine: over the stage's data-parallel group.
      const detail::NodeLayout group =
          detail::stage_group_nodes(detail::stage_topology(config, stages, cluster.world(), cluster.gpus_per_node));
      detail::require_resolved(config, group.world, /*pipeline_stage=*/true);
      config_detail::check_layouts(config);
      config_detail::check_quantization_precision(config);
      detail::make_shard_layout(config.zero, group);
      return "";
    }
    detail::require_resolved(config, cluster.world());
    config_detail::check_layouts(config);
    config_detail::check_quantization_precision(config);
    detail::make_shard_layout(
        config.zero, detail::make_node_layout(cluster.world(), cluster.gpus_per_node, source + ": gpus_per_node"));
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const Unsupported& e) {
    return e.what();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string LayoutChoice::layout(int64_t gpus_per_node, int64_t world) const {
  auto group = [&](int64_t ranks) {
    if (ranks % gpus_per_node != 0) return "groups of " + std::to_string(ranks) + " ranks";
    const int64_t k = ranks / gpus_per_node;
    return k == 1 ? std::string("one node") : std::to_string(k) + " nodes";
  };
  if (pipeline_stages > 1) {
    const std::string schedule =
        virtual_stages > 1 ? "interleaved x" + std::to_string(virtual_stages) : pipeline_schedule;
    std::string s =
        "pipeline " + std::to_string(pipeline_stages) + " x " + schedule + ", ZeRO-" + std::to_string(zero_stage);
    if (world > 0) {
      const int64_t d = world / pipeline_stages;
      s += d == 1 ? ", 1 rank" : ", " + (d % gpus_per_node == 0 ? group(d) : std::to_string(d) + " ranks");
    }
    if (stage_order != "stages_across_nodes") s += ", " + stage_order;
    return s;
  }
  std::string s = hpz_partition_size > 1
                      ? std::string(secondary_on_host ? "hpZ/host, " : "hpZ, ") + group(hpz_partition_size)
                  : mics_shard_size > 0 ? std::string(mics_shard_size == gpus_per_node ? "MiCS/HSDP, " : "MiCS, ") +
                                              group(mics_shard_size) + (hierarchical ? ", hierarchical" : "")
                                        : std::string("ZeRO-3");
  if (qwz) s += " + qwZ";
  if (qgz) s += " + qgZ";
  return s;
}

std::string LayoutChoice::describe(int64_t gpus_per_node, int64_t world) const {
  const std::string s = layout(gpus_per_node, world);
  if (offload_optimizer == OffloadDevice::none && offload_param == OffloadDevice::none) return s + "; no offload";
  return s + "; offload optimizer " + device_name(offload_optimizer) + ", parameters " + device_name(offload_param);
}

Advice advise_layouts(const std::string& config_json, const std::string& config_source, const ModelDesc& model,
                      const LlamaDims& dims, const ClusterDesc& cluster, const AdviseOptions& options) {
  ZERO3_REQUIRE(options.seq_len >= 1, InvalidArgument, "advise_layouts: seq_len ", options.seq_len,
                " must be at least 1");
  ZERO3_REQUIRE(!options.activation_bytes || *options.activation_bytes >= 0, InvalidArgument,
                "advise_layouts: activation_bytes ", options.activation_bytes.value_or(0), " must be >= 0");
  ZERO3_REQUIRE(options.gpu_headroom_bytes >= 0, InvalidArgument, "advise_layouts: gpu_headroom_bytes ",
                options.gpu_headroom_bytes, " must be >= 0");
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
  if (options.pipelines) {
    for (const LayoutChoice& l :
         enumerate_pipelined(cluster.world(), static_cast<int64_t>(model.units.size()), offloads))
      choices.push_back(l);
  }
  const LayoutChoice as_is = choice_of(user);
  if (std::none_of(choices.begin(), choices.end(), [&](const LayoutChoice& c) { return c == as_is; })) {
    choices.push_back(as_is);  // the user's own layout, outside the list: ranked beside it
  }

  Advice advice;
  advice.config_source = config_source;
  advice.gpu_plan_bytes = cluster.gpu_plan_bytes();
  advice.host_plan_bytes = cluster.host_plan_bytes();
  advice.gpu_headroom_bytes = options.gpu_headroom_bytes;
  advice.micro_batch = *user.train_micro_batch_size_per_gpu;
  advice.seq_len = options.seq_len;
  advice.checkpointing = options.checkpointing;
  if (options.activation_bytes) {
    advice.activation_bytes = *options.activation_bytes;
  } else {
    // The layouts change neither the batch nor the dtypes: one estimate for all of them, from the user's config.
    ActivationOptions act;
    act.micro_batch = *user.train_micro_batch_size_per_gpu;
    act.seq_len = options.seq_len;
    act.checkpointing = options.checkpointing;
    act.on_gpu = user.zero3.device != "cpu";
    act.compute = user.compute_dtype();
    act.grad_accum = user.grad_accum_dtype.value_or(DType::f32);
    advice.activations = estimate_activations(dims, act);
    advice.activation_bytes = advice.activations.total();
    advice.activations_estimated = true;
  }
  MemoryPlanOptions memory;
  memory.world_size = cluster.world();
  memory.ranks_per_node = cluster.gpus_per_node;
  memory.activation_bytes = advice.activation_bytes;
  StepTimeOptions timing;
  timing.seq_len = options.seq_len;

  QuietLog quiet;
  for (const LayoutChoice& choice : choices) {
    AdvisedLayout a;
    a.choice = choice;
    a.edits = edits_for(choice, user, raw, nvme_path);
    a.is_user_config = a.edits.empty();
    a.deepspeed = deepspeed_differences(choice, cluster.world());
    a.config = user;
    Config c;
    const bool pipelined = choice.pipeline_stages > 1;
    ResolveInputs row_inputs = inputs;
    try {
      if (choice.pipeline_stages != user.pipeline.stages.value_or(1)) {
        // The user's global batch at the row's stages: the micro-batches follow the data-parallel size.
        const int64_t ga = detail::pipelined_grad_accum(user, cluster.world(), choice.pipeline_stages);
        if (row_inputs.grad_accum) row_inputs.grad_accum = ga;
        const json* file_ga = find_path(raw, "gradient_accumulation_steps");
        if (file_ga != nullptr && file_ga->is_number() && ga != *user.gradient_accumulation_steps) {
          a.edits.push_back({"gradient_accumulation_steps", std::to_string(ga)});
          a.is_user_config = false;
        }
      }
      c = parse_config(apply_config_edits(config_json, a.edits, config_source), config_source + " with the edits");
      resolve(c, row_inputs);
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
    a.config = c;
    if (pipelined) {
      try {
        const detail::PipelinedMemory plan = detail::plan_pipelined_row(model, dims, c, cluster, advice);
        a.gpu_bytes = plan.gpu_bytes;
        a.host_node_bytes = plan.host_node_bytes;
        a.nvme_node_bytes = plan.nvme_node_bytes;
        a.bubble = plan.bubble;
      } catch (const Error& e) {  // more stages than units, tied embeddings: what the pipeline plans refuse
        a.reason = std::string("zero3 plan: ") + e.what();
        advice.refused.push_back(std::move(a));
        continue;
      }
      a.note = detail::pipelined_note(choice, c, row_inputs.grad_accum.has_value());
    } else {
      const MemoryPlan plan = plan_memory(model, c, memory);
      a.gpu_bytes = plan.device_is_host ? 0 : plan.rank_bytes(MemoryTier::device);
      a.host_node_bytes =
          plan.node_bytes(MemoryTier::host) + (plan.device_is_host ? plan.node_bytes(MemoryTier::device) : 0);
      a.nvme_node_bytes = plan.node_bytes(MemoryTier::nvme);
    }
    a.gpu_free_bytes = advice.gpu_plan_bytes - a.gpu_bytes;
    if (a.gpu_bytes + advice.gpu_headroom_bytes > advice.gpu_plan_bytes) {
      a.reason = "GPU " + gib(a.gpu_bytes) + " + headroom " + gib(advice.gpu_headroom_bytes) + " > " +
                 gib(advice.gpu_plan_bytes);
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
    a.time = time_layout(model, dims, c, cluster, timing);
    advice.ranked.push_back(std::move(a));
  }
  std::stable_sort(advice.ranked.begin(), advice.ranked.end(), ranks_before);
  for (size_t i = 0; i < advice.ranked.size(); ++i) {
    if (advice.ranked[i].is_user_config) advice.user_config_rank = i;
  }
  const std::vector<size_t> by_bandwidth =
      ranks_by(advice.ranked, [](const AdvisedLayout& a) { return a.time.step_s; });
  const std::vector<size_t> by_fixed =
      ranks_by(advice.ranked, [](const AdvisedLayout& a) { return a.time.step_fixed_s; });
  ReadingsNote note;
  for (size_t i = 0; i < advice.ranked.size(); ++i) {
    advice.ranked[i].rank_bandwidth = by_bandwidth[i];
    advice.ranked[i].rank_fixed_cost = by_fixed[i];
    if (by_bandwidth[i] == 1) note.bandwidth_first = i;
    if (by_fixed[i] == 1) note.fixed_cost_first = i;
  }
  if (!advice.ranked.empty() && (note.bandwidth_first != 0 || note.fixed_cost_first != 0)) {
    // Where the first row changes: the bandwidth reading's first leads at no cost per collective; the smallest cost
    // at which another layout leads, to 0.01 ms (the step times are piecewise linear in it, the first row's step
    // grows no faster than the others' once it leads on locality).
    const double top = cluster.collective_overhead_ms;
    if (cluster.collective_overhead_ms > 0 &&
        first_at_overhead(advice, model, dims, cluster, timing, top) != note.bandwidth_first) {
      double lo = 0, hi = top;
      while (hi - lo > 0.01) {
        const double mid = (lo + hi) / 2;
        (first_at_overhead(advice, model, dims, cluster, timing, mid) == note.bandwidth_first ? lo : hi) = mid;
      }
      note.crossover_overhead_ms = hi;
    }
    advice.readings = note;
  }
  return advice;
}

std::string format_advice(const Advice& advice, const ClusterDesc& cluster, int64_t steps, size_t top) {
  std::ostringstream out;
  char buf[768];
  const size_t total = advice.ranked.size() + advice.not_fitting.size() + advice.refused.size();
  out << total << " layouts of " << advice.config_source << " on " << (cluster.name.empty() ? "-" : cluster.name)
      << " (" << cluster.source << "), " << cluster.nodes << " nodes x " << cluster.gpus_per_node
      << " GPUs: " << advice.ranked.size() << " ranked, " << advice.not_fitting.size() << " do not fit, "
      << advice.refused.size() << " refused\n";
  std::snprintf(buf, sizeof buf,
                "memory a plan may use: %s per GPU (gpu_memory_gib %.4g - gpu_reserved_gib %.4g), of which a layout "
                "must leave %s free to fit (headroom, --gpu-headroom); %s of host memory per node (host_memory_gib "
                "%.4g - host_reserved_gib %.4g)\n",
                gib(advice.gpu_plan_bytes).c_str(), cluster.gpu_memory_gib, cluster.gpu_reserved_gib,
                gib(advice.gpu_headroom_bytes).c_str(), gib(advice.host_plan_bytes).c_str(), cluster.host_memory_gib,
                cluster.host_reserved_gib);
  out << buf;
  if (advice.activations_estimated) {
    const ActivationEstimate& e = advice.activations;
    std::snprintf(buf, sizeof buf,
                  "activations: %s per GPU, micro-batch %lld x seq %lld, activation checkpointing %s, as "
                  "llama3_train --dry-run counts them (residual streams %s, layer caches %s, workspace %s, "
                  "attention %s, logits chunk %s, unit staging %s); --activation-bytes overrides\n",
                  gib(advice.activation_bytes).c_str(), static_cast<long long>(advice.micro_batch),
                  static_cast<long long>(advice.seq_len), advice.checkpointing ? "on" : "off",
                  gib(e.layer_inputs).c_str(), gib(e.layer_caches).c_str(), gib(e.workspace).c_str(),
                  gib(e.attention).c_str(), gib(e.loss_chunk).c_str(), gib(e.unit_staging).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "activations: %s per GPU (--activation-bytes)\n",
                  gib(advice.activation_bytes).c_str());
  }
  out << buf;
  if (cluster.collective_overhead_ms > 0) {
    std::snprintf(buf, sizeof buf,
                  "step: the range between the network read as a bandwidth loss (collective_efficiency %.4g) and as "
                  "a fixed cost per collective that crosses nodes (collective_overhead_ms %.4g); ranked by its high "
                  "end, each row's rank by each reading alone beside it (bw, fixed)\n",
                  cluster.collective_efficiency, cluster.collective_overhead_ms);
  } else {
    std::snprintf(buf, sizeof buf,
                  "step: one reading of the network (collective_efficiency %.4g; the cluster description has no "
                  "collective_overhead_ms for the other)\n",
                  cluster.collective_efficiency);
  }
  out << buf;
  out << "hpZ/host: hpZ with its secondary partition in pinned host memory (zero3.hpz_secondary_memory \"host\")\n";
  out << "pipeline S x schedule, ZeRO-k, group: S stages across the nodes (pipeline.stages, zero3.pipeline_schedule; "
         "interleaved xV: interleaved_1f1b with V stages per rank), ZeRO stage k inside each over its data-parallel "
         "group; GPU: its worst pipeline rank\n\n";

  const std::string steps_header = std::to_string(steps) + " steps";
  std::snprintf(buf, sizeof buf, "%5s  %-40s %-9s %-10s %10s %9s %10s %15s %15s %4s %5s  %s\n", "rank", "layout",
                "optimizer", "parameters", "GPU", "free", "host/node", "step, low-high", steps_header.c_str(), "bw",
                "fixed", "bound");
  out << buf;
  const size_t shown = top == 0 ? advice.ranked.size() : std::min(top, advice.ranked.size());
  const double n = static_cast<double>(steps);
  std::vector<std::string> sources;  // DeepSpeed's places, numbered in the order the rows name them
  auto source_number = [&](const std::string& where) {
    auto it = std::find(sources.begin(), sources.end(), where);
    if (it == sources.end()) it = sources.insert(sources.end(), where);
    return static_cast<size_t>(it - sources.begin()) + 1;
  };
  auto deepspeed_line = [&](const AdvisedLayout& a) {
    std::string line;
    for (const DeepSpeedDifference& d : a.deepspeed) {
      line += (line.empty() ? "" : "; ") + d.what + " [" + std::to_string(source_number(d.where)) + "]";
    }
    return line;
  };
  for (size_t i = 0; i < shown; ++i) {
    const AdvisedLayout& a = advice.ranked[i];
    const StepTime& t = a.time;
    const std::string rank = std::to_string(i + 1) + (a.is_user_config ? "*" : "");
    auto where = [](OffloadDevice d) { return d == OffloadDevice::none ? "GPU" : device_name(d); };
    std::snprintf(buf, sizeof buf, "%5s  %-40s %-9s %-10s %10s %9s %10s %15s %15s %4zu %5zu  %s\n", rank.c_str(),
                  a.choice.layout(cluster.gpus_per_node, cluster.world()).c_str(), where(a.choice.offload_optimizer),
                  where(a.choice.offload_param), gib(a.gpu_bytes).c_str(), gib(a.gpu_free_bytes).c_str(),
                  gib(a.host_node_bytes).c_str(), format_seconds_range(t.step_low_s(), t.step_high_s()).c_str(),
                  format_seconds_range(t.step_low_s() * n, t.step_high_s() * n).c_str(), a.rank_bandwidth,
                  a.rank_fixed_cost, t.bound.c_str());
    out << buf;
    std::string edits;
    for (const ConfigEdit& e : a.edits) edits += (edits.empty() ? "" : ", ") + e.text();
    out << "       edits: " << (edits.empty() ? "none (your config as it is)" : edits) << '\n';
    if (!a.note.empty()) {
      std::snprintf(buf, sizeof buf, "       pipelined: bubble %.3f; %s\n", a.bubble, a.note.c_str());
      out << buf;
    }
    if (!a.deepspeed.empty()) {
      const bool refuses =
          std::any_of(a.deepspeed.begin(), a.deepspeed.end(), [](const DeepSpeedDifference& d) { return d.refuses; });
      out << "       DeepSpeed " << (refuses ? "refuses this layout" : "runs another layout") << ": "
          << deepspeed_line(a) << '\n';
    }
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
  if (advice.readings) {
    const ReadingsNote& r = *advice.readings;
    const AdvisedLayout& bw = advice.ranked[r.bandwidth_first];
    const AdvisedLayout& fixed = advice.ranked[r.fixed_cost_first];
    auto name = [&](const AdvisedLayout& a, size_t index) {
      return "rank " + std::to_string(index + 1) + " (" + a.choice.describe(cluster.gpus_per_node, cluster.world()) +
             ")";
    };
    if (r.bandwidth_first != r.fixed_cost_first) {
      std::snprintf(buf, sizeof buf,
                    "\nthe readings disagree on the first row: by bandwidth alone %s leads, %.2f s a step (%.2f s by "
                    "the fixed cost); by the fixed cost alone %s, %.2f s (%.2f s by bandwidth).\n",
                    name(bw, r.bandwidth_first).c_str(), bw.time.step_s, bw.time.step_fixed_s,
                    name(fixed, r.fixed_cost_first).c_str(), fixed.time.step_fixed_s, fixed.time.step_s);
    } else {
      std::snprintf(buf, sizeof buf,
                    "\nboth readings alone put %s first, %.2f s and %.2f s a step; rank 1's slower reading is the "
                    "lower.\n",
                    name(bw, r.bandwidth_first).c_str(), bw.time.step_s, bw.time.step_fixed_s);
    }
    out << buf;
    const char* decides = r.fixed_cost_first == 0  ? "the fixed-cost reading decides rank 1"
                          : r.bandwidth_first == 0 ? "the bandwidth reading decides rank 1"
                                                   : "rank 1 leads neither reading alone: it has the lowest worst case";
    out << "  " << decides
        << ". The ranking takes each row's slower reading because the model cannot yet say which one the network "
           "follows: both came in under the one run they were not fitted to (DeepSpeed over TCP, "
           "docs/performance-model.md), so the slower one is the step a row is least likely to exceed.\n";
    if (r.crossover_overhead_ms) {
      std::snprintf(buf, sizeof buf,
                    "  %s would lead only while a collective across nodes costs less than %.2f ms; this description "
                    "says %.4g ms (collective_overhead_ms, fitted to a measured run).\n",
                    bw.choice.layout(cluster.gpus_per_node, cluster.world()).c_str(), *r.crossover_overhead_ms,
                    cluster.collective_overhead_ms);
      out << buf;
    }
  }
  if (std::any_of(advice.ranked.begin(), advice.ranked.end(),
                  [](const AdvisedLayout& a) { return a.nvme_node_bytes > 0; })) {
    out << "NVMe space is not checked: the cluster description has no NVMe capacity\n";
  }
  out << "\ndo not fit (never ranked): " << advice.not_fitting.size() << '\n';
  for (const AdvisedLayout& a : advice.not_fitting) {
    out << "  " << a.choice.describe(cluster.gpus_per_node, cluster.world())
        << (a.is_user_config ? " (your config)" : "") << ": " << a.reason << '\n';
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
      out << "    " << a.choice.describe(cluster.gpus_per_node, cluster.world())
          << (a.is_user_config ? " (your config)" : "") << '\n';
    }
  }
  if (!sources.empty()) {
    out << "\nwhere DeepSpeed (microsoft/DeepSpeed, deepspeed/) differs from zero3 for the rows above; zero3 runs "
           "each layout as configured (docs/config.md, \"DeepSpeed's limits\"):\n";
    for (size_t i = 0; i < sources.size(); ++i) out << "  [" << i + 1 << "] " << sources[i] << '\n';
  }
  return out.str();
}

}  // namespace zero3

// parse_config / load_config: walks the JSON against the key table (key_table.cpp).
#include <set>

#include "config/config_checks.hpp"
#include "config/config_file.hpp"
#include "config/json_text.hpp"
#include "config/key_table.hpp"
#include "config/suggest.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace config_detail {
namespace {

std::string join_path(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  std::string p(prefix);
  p += '.';
  p += name;
  return p;
}

// Whether an ignored key deserves its warning, or a refused key its error.
bool is_active(const KeyEntry& e, const nlohmann::json& v) {
  switch (e.when) {
    case When::not_default:
      if (e.default_json.empty()) return !v.is_null();
      return v != nlohmann::json::parse(e.default_json);
    case When::enabled:
      if (v.is_object()) return v.contains("enabled") && v["enabled"] == true;
      return v == true;
    case When::present:
      return !(v.is_null() || (v.is_object() && v.empty()) || (v.is_array() && v.empty()));
    case When::above_one: {
      auto above = [](const nlohmann::json& x) { return x.is_number() && x.get<double>() > 1; };
      if (v.is_object()) {
        for (const char* k : {"autotp_size", "tp_size"}) {
          if (v.contains(k) && above(v[k])) return true;
        }
        if (v.contains("tp") && v["tp"].is_object() && v["tp"].contains("tp_size") && above(v["tp"]["tp_size"])) {
          return true;
        }
        return false;
      }
      return above(v);
    }
  }
  return true;
}

std::string section_title(std::string_view section) { return section.empty() ? "the top level" : std::string(section); }

// "did you mean" for an unknown key: a close name in the same section, or the section the key belongs to.
std::string hint_for(std::string_view name, std::string_view canonical_section) {
  std::vector<std::string_view> names;
  for (const KeyEntry* e : children_of(canonical_section)) names.push_back(leaf_name(e->path));
  std::string close = closest_name(name, names);
  if (!close.empty()) return "did you mean \"" + close + "\"?";
  for (const KeyEntry& e : key_table()) {
    if (leaf_name(e.path) == name && parent_of(e.path) != canonical_section) {
      return "\"" + std::string(name) + "\" belongs in " + section_title(parent_of(e.path)) + " (as " +
             std::string(e.path) + ")";
    }
  }
  std::string known = "known keys: ";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) known += ", ";
    known += names[i];
  }
  return known;
}

class Reader {
 public:
  explicit Reader(ReadContext& ctx) : ctx_(ctx) {}

  void read_section(const nlohmann::json& object, std::string_view canonical_section, std::string_view user_prefix) {
    std::set<std::string> matched;
    for (const KeyEntry* e : children_of(canonical_section)) {
      std::string name(leaf_name(e->path));
      auto it = object.find(name);
      if (it == object.end()) continue;
      matched.insert(name);
      if (it->is_null()) continue;  // null: not given, as DeepSpeed's Optional fields read it
      handle(*e, *it, join_path(user_prefix, name));
    }
    std::vector<std::string> unknown;
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (!matched.count(it.key())) unknown.push_back(it.key());
    }
    if (unknown.empty()) return;
    if (canonical_section.empty()) {
      // DeepSpeed ignores unknown top-level keys; so do we, but not silently. The first few are named.
      constexpr size_t kNamed = 10;
      std::string w = "unknown top-level keys, ignored (DeepSpeed ignores them too): ";
      for (size_t i = 0; i < unknown.size() && i < kNamed; ++i) {
        if (i) w += "; ";
        w += "\"" + shorten(unknown[i]) + "\"";
        std::string h = hint_for(unknown[i], "");
        if (h.rfind("known keys", 0) != 0) w += " (" + h + ")";
      }
      if (unknown.size() > kNamed) w += "; and " + std::to_string(unknown.size() - kNamed) + " more";
      ctx_.warn(w);
      return;
    }
    const std::string path = join_path(user_prefix, shorten(unknown.front()));
    throw ConfigError(error_text(
        path, "unknown key in " + std::string(user_prefix) + "; " + hint_for(unknown.front(), canonical_section),
        ctx_.source));
  }

 private:
  void record_given(std::string_view canonical, const std::string& user_path) {
    auto [it, inserted] = ctx_.given.emplace(std::string(canonical), user_path);
    if (!inserted) {
      throw ConfigError(error_text(
          user_path, "sets the same thing as " + it->second + ", which is also given; keep one of them", ctx_.source));
    }
  }

  void handle(const KeyEntry& entry, const nlohmann::json& json, const std::string& user_path) {
    const KeyEntry* target = &entry;
    if (entry.status == KeyStatus::alias || entry.status == KeyStatus::deprecated) {
      if (!entry.alias_of.empty()) {
        target = find_key(entry.alias_of);
        if (!target) throw ConfigError("config key table: " + std::string(entry.path) + " names a missing key");
      }
      record_given(entry.alias_of.empty() ? entry.path : entry.alias_of, user_path);
      if (entry.status == KeyStatus::deprecated) {
        std::string w = user_path + ": deprecated. " + std::string(entry.doc);
        if (!entry.alias_of.empty()) w += " Read as " + std::string(entry.alias_of) + ".";
        ctx_.warn(w);
      }
      if (entry.apply) {  // a deprecated form with its own meaning (cpu_offload: true, ...)
        entry.apply(ctx_, Value(json, user_path, ctx_));
        return;
      }
    } else {
      record_given(entry.path, user_path);
    }
    apply(*target, json, user_path);
  }

  void apply(const KeyEntry& e, const nlohmann::json& json, const std::string& user_path) {
    Value v(json, user_path, ctx_);
    if (v.is_auto() && !e.auto_ok) {
      v.fail(std::string(e.is_section()   ? "an object"
                         : e.type.empty() ? "a value"
                                          : e.type) +
             "; zero3 resolves \"auto\" only where Hugging Face fills it in (see docs/config.md)");
    }
    switch (e.status) {
      case KeyStatus::supported:
      case KeyStatus::alias:
      case KeyStatus::deprecated:
        break;
      case KeyStatus::ignored:
        if (e.apply) e.apply(ctx_, v);  // validates the type; the value has no effect
        if (is_active(e, json)) ctx_.warn(user_path + ": ignored. " + std::string(e.doc));
        return;
      case KeyStatus::refused:
        if (is_active(e, json)) {
          v.fail_with("got " + show(json) + ": not supported. " + std::string(e.doc));
        }
        return;
    }
    if (e.path == "zero_optimization" && json.is_boolean()) {
      ctx_.warn(user_path + ": the boolean form is deprecated; read as {\"stage\": " +
                std::string(json.get<bool>() ? "1" : "0") + "}. Write \"zero_optimization\": {\"stage\": N}.");
      ctx_.config.zero.stage = json.get<bool>() ? 1 : 0;
      return;
    }
    if (e.is_section()) {
      if (!json.is_object())
        v.fail(e.path == "zero_optimization" ? "an object (or the old boolean form)" : "an object");
      if (e.apply) e.apply(ctx_, v);
      read_section(json, e.path, user_path);
      return;
    }
    if (!e.only_for.empty()) check_applies(e, v);
    if (e.apply) e.apply(ctx_, v);
  }

  // A scheduler parameter of another scheduler type is an error, as DeepSpeed's constructors make it.
  void check_applies(const KeyEntry& e, const Value& v) {
    std::string_view type = scheduler_type_name(ctx_.config.scheduler.type);
    std::string list = " " + std::string(e.only_for) + " ";
    if (!type.empty() && list.find(" " + std::string(type) + " ") != std::string::npos) return;
    v.fail_with("not a parameter of " + std::string(type.empty() ? "this scheduler" : type) + " (it belongs to " +
                std::string(e.only_for) + ")");
  }

  ReadContext& ctx_;
};

// What the key-by-key walk cannot decide: defaults that depend on other keys and required keys.
void finish(ReadContext& ctx) {
  Config& c = ctx.config;
  if (!c.zero.overlap_comm_set) c.zero.overlap_comm = c.zero.stage == 3;
  c.fp16.section_given = ctx.given.count("fp16") > 0;
  c.bf16.section_given = ctx.given.count("bf16") > 0;
  if (c.zero.offload_param.device != OffloadDevice::none && c.zero.stage != 3) {
    // DeepSpeed reads offload_param only in its stage 3 optimizer; below stage 3 it is ignored.
    auto it = ctx.given.find("zero_optimization.offload_param");
    const std::string key = it != ctx.given.end() ? it->second : "zero_optimization.offload_param";
    ctx.warn(key + ": ignored at zero_optimization.stage " + std::to_string(c.zero.stage) +
             ", as DeepSpeed ignores it there: only stage 3 partitions parameters, so only stage 3 offloads "
             "them. Its device is read as \"none\".");
    c.zero.offload_param.device = OffloadDevice::none;
  }
  if (ctx.cpu_offload_use_pin_memory) {
    if (ctx.cpu_offload) c.zero.offload_optimizer.pin_memory = *ctx.cpu_offload_use_pin_memory;
    if (ctx.cpu_offload_param) c.zero.offload_param.pin_memory = *ctx.cpu_offload_use_pin_memory;
  }
  if (c.optimizer.present && c.optimizer.type == OptimizerType::adamw && !c.optimizer.adam_w_mode) {
    ctx.warn(
        "optimizer.params.adam_w_mode: false has no effect with type \"AdamW\" (DeepSpeed runs AdamW too); "
        "use type \"Adam\" for Adam with L2 weight decay");
    c.optimizer.adam_w_mode = true;
  }
  SchedulerConfig& s = c.scheduler;
  if (s.type == SchedulerType::warmup_lr && !ctx.warmup_max_lr_given) {
    // DeepSpeed's WarmupLR warms up to the optimizer's learning rate; resolve() fills it in.
    s.warmup_max_lr.reset();
    ctx.mark_auto("scheduler.params.warmup_max_lr");
  }
  if ((s.type == SchedulerType::warmup_decay_lr || s.type == SchedulerType::warmup_cosine_lr) &&
      !ctx.given.count("scheduler.params.total_num_steps")) {
    throw ConfigError(error_text("scheduler.params.total_num_steps",
                                 "missing; " + std::string(scheduler_type_name(s.type)) +
                                     " needs the number of optimizer steps of the run (a number, or \"auto\" "
                                     "resolved from --total-steps)",
                                 ctx.source));
  }
  if (s.type == SchedulerType::one_cycle) {
    for (const char* k : {"scheduler.params.cycle_min_lr", "scheduler.params.cycle_max_lr"}) {
      if (!ctx.given.count(k)) {
        throw ConfigError(error_text(k, "missing; OneCycle needs it (DeepSpeed has no default)", ctx.source));
      }
    }
  }
  if (!ctx.cycle_second_stair_count_given) s.cycle_second_stair_count = s.cycle_first_stair_count;
}

}  // namespace
}  // namespace config_detail

Config parse_config(const std::string& json_text, const std::string& source) {
  using namespace config_detail;
  nlohmann::json root = parse_json_text(json_text, source);
  if (!root.is_object()) {
    throw ConfigError(source + ": the top level must be a JSON object {...}, got " + show(root));
  }
  Config config;
  config.source = source;
  ReadContext ctx{config, source};
  Reader(ctx).read_section(root, "", "");
  finish(ctx);
  check_static(config);
  for (const std::string& w : config.warnings) log::warn_rank0(source, ": ", w);
  return config;
}

Config load_config(const std::string& path, uint64_t max_bytes) {
  return parse_config(config_detail::read_config_file(path, max_bytes), path);
}

}  // namespace zero3

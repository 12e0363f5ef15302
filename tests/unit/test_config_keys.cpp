// The key table, key by key: every supported key is read and written back, every alias and deprecated
// name sets its key, every ignored key warns only when set, every refused key refuses only when set, the
// table's defaults are the structs' defaults, and docs/config.md is the table's output.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/key_table.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using config_detail::KeyEntry;
using config_detail::KeyStatus;
using json = nlohmann::json;

namespace {

// Sets `value` at a dotted path inside `root`.
void set_path(json& root, std::string_view path, const json& value) {
  json* node = &root;
  size_t dot;
  while ((dot = path.find('.')) != std::string_view::npos) {
    node = &(*node)[std::string(path.substr(0, dot))];
    path = path.substr(dot + 1);
  }
  (*node)[std::string(path)] = value;
}

const json* get_path(const json& root, std::string_view path) {
  const json* node = &root;
  size_t dot;
  while (true) {
    dot = path.find('.');
    std::string part(path.substr(0, dot));
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
    if (dot == std::string_view::npos) return node;
    path = path.substr(dot + 1);
  }
}

// A config in which every supported key is legal: stage 3, an optimizer, and a scheduler of the type the
// key belongs to.
json base_for(const KeyEntry& e) {
  json root = {{"zero_optimization", {{"stage", 3}}}, {"optimizer", {{"type", "AdamW"}}}};
  if (e.path == "optimizer.params.adam_w_mode") root["optimizer"]["type"] = "Adam";  // AdamW forces it on
  if (e.path == "zero_optimization.mics_hierarchical_params_gather") root["zero_optimization"]["mics_shard_size"] = 8;
  if (e.path.rfind("scheduler.", 0) == 0) {
    std::string type(e.only_for.empty() ? "WarmupDecayLR" : e.only_for.substr(0, e.only_for.find(' ')));
    root["scheduler"] = {{"type", type}, {"params", json::object()}};
    if (type == "WarmupDecayLR" || type == "WarmupCosineLR") root["scheduler"]["params"]["total_num_steps"] = 100;
    if (type == "OneCycle") {
      root["scheduler"]["params"]["cycle_min_lr"] = 0.0001;
      root["scheduler"]["params"]["cycle_max_lr"] = 0.001;
    }
  }
  return root;
}

// A legal value for the key that differs from its default (so reading it must change something).
json other_value(const KeyEntry& e) {
  static const std::map<std::string, json> special = {
      {"optimizer.type", "Adam"},
      {"scheduler.type", "WarmupDecayLR"},
      {"scheduler.params.warmup_type", "linear"},
      {"zero_optimization.stage", 2},
      {"zero_optimization.offload_param.device", "nvme"},
      {"zero_optimization.offload_optimizer.device", "nvme"},
      {"zero_optimization.offload_optimizer.ratio", 0.5},
      {"communication_data_type", "bf16"},
      {"data_types.grad_accum_dtype", "bf16"},
      {"checkpoint.tag_validation", "Fail"},
      {"zero3.device", "cpu"},
      {"zero3.comm_backend", "gloo"},
      {"zero3.network", "socket"},
      {"zero3.hpz_secondary_memory", "host"},
      {"pipeline.partition", "type:DecoderLayer"},
      {"zero3.pipeline_schedule", "gpipe"},
      {"zero3.pipeline_virtual_stages", 2},
      {"zero3.pipeline_stage_order", "stages_within_node"},
      {"zero3.pipeline_gradient_reduction", "step"},
      {"optimizer.params.betas", json::array({0.8, 0.95})},
      {"scheduler.params.cycle_min_lr", 0.0002},
      {"scheduler.params.cycle_max_lr", 0.003},
      {"scheduler.params.total_num_steps", 77},
      {"zero_optimization.stage3_model_persistence_threshold", 1000},
  };
  auto it = special.find(std::string(e.path));
  if (it != special.end()) return it->second;
  json def = e.default_json.empty() || e.default_json == "null" ? json() : json::parse(e.default_json);
  if (e.type.rfind("boolean", 0) == 0) return def.is_boolean() ? json(!def.get<bool>()) : json(true);
  if (e.type.rfind("integer", 0) == 0) return def.is_number() ? json(def.get<int64_t>() + 3) : json(7);
  if (e.type.rfind("number", 0) == 0) return def.is_number() ? json(def.get<double>() + 0.25) : json(0.75);
  if (e.type == "string") return "value-for-test";
  ADD_FAILURE() << e.path << ": no test value for type " << e.type;
  return json();
}

std::string text(const json& j) { return j.dump(); }

json written(const Config& c) { return json::parse(to_json(c)); }

bool has_warning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

bool is_value_key(const KeyEntry& e) { return !e.is_section() && e.status == KeyStatus::supported; }

}  // namespace

TEST(ConfigKeys, TableIsWellFormed) {
  std::set<std::string> paths;
  for (const KeyEntry& e : config_detail::key_table()) {
    EXPECT_TRUE(paths.insert(std::string(e.path)).second) << "duplicate path " << e.path;
    std::string_view parent = config_detail::parent_of(e.path);
    if (!parent.empty()) {
      const KeyEntry* p = config_detail::find_key(parent);
      ASSERT_NE(p, nullptr) << e.path << ": parent section missing";
      EXPECT_TRUE(p->is_section()) << e.path;
      EXPECT_LT(p - config_detail::key_table().data(), &e - config_detail::key_table().data())
          << e.path << ": sections come before their keys";
    }
    if (!e.alias_of.empty()) {
      const KeyEntry* target = config_detail::find_key(e.alias_of);
      ASSERT_NE(target, nullptr) << e.path << " names " << e.alias_of;
      EXPECT_TRUE(target->status != KeyStatus::alias && target->status != KeyStatus::deprecated) << e.path;
    }
    if (e.status == KeyStatus::alias) {
      EXPECT_FALSE(e.alias_of.empty()) << e.path;
    }
    if (e.status == KeyStatus::supported && !e.is_section()) {
      EXPECT_NE(e.apply, nullptr) << e.path;
      EXPECT_NE(e.emit, nullptr) << e.path;
    }
    if (e.status != KeyStatus::alias) {
      EXPECT_FALSE(e.doc.empty()) << e.path << ": every key has a line of doc";
    }
    if (!e.default_json.empty()) {
      EXPECT_TRUE(json::accept(e.default_json)) << e.path;
    }
  }
}

TEST(ConfigKeys, TableDefaultsAreTheStructDefaults) {
  // Write a default Config with a section of every kind present, then compare each key to the table.
  Config c;
  c.optimizer.present = true;
  for (const KeyEntry& e : config_detail::key_table()) {
    if (!is_value_key(e) || e.default_json.empty() || e.path.rfind("scheduler.", 0) == 0) continue;
    if (e.path == "zero_optimization.overlap_comm") continue;  // null: depends on the stage
    std::optional<nlohmann::ordered_json> v = e.emit(c);
    ASSERT_TRUE(v.has_value()) << e.path;
    EXPECT_EQ(json::parse(v->dump()), json::parse(e.default_json)) << e.path;
  }
  const std::map<std::string, std::string> required = {
      {"WarmupLR", R"({"warmup_max_lr": 0.001})"},
      {"WarmupDecayLR", R"({"total_num_steps": 5})"},
      {"WarmupCosineLR", R"({"total_num_steps": 5})"},
      {"OneCycle", R"({"cycle_min_lr": 0, "cycle_max_lr": 0})"},
  };
  for (const auto& [type, params] : required) {
    Config s = parse_config(R"({"scheduler": {"type": ")" + type + R"(", "params": )" + params + "}}");
    json out = written(s);
    for (const KeyEntry& e : config_detail::key_table()) {
      if (!is_value_key(e) || e.default_json.empty() || e.path.rfind("scheduler.params.", 0) != 0) continue;
      if ((" " + std::string(e.only_for) + " ").find(" " + type + " ") == std::string::npos) continue;
      if (e.path == "scheduler.params.cycle_second_stair_count") continue;  // null: follows the first count
      const json* v = get_path(out, e.path);
      ASSERT_NE(v, nullptr) << type << " " << e.path;
      EXPECT_EQ(*v, json::parse(e.default_json)) << type << " " << e.path;
    }
  }
}

TEST(ConfigKeys, EverySupportedKeyIsReadAndWrittenBack) {
  int checked = 0;
  for (const KeyEntry& e : config_detail::key_table()) {
    if (!is_value_key(e)) continue;
    json root = base_for(e);
    json value = other_value(e);
    set_path(root, e.path, value);
    SCOPED_TRACE(std::string(e.path) + " = " + text(value));
    Config c;
    ASSERT_NO_THROW(c = parse_config(text(root), "keys.json"));
    json out = written(c);
    const json* back = get_path(out, e.path);
    ASSERT_NE(back, nullptr) << "not written back: " << out.dump();
    EXPECT_EQ(*back, value);
    // And the written JSON reads back to the same JSON.
    Config again = parse_config(out.dump(), "again.json");
    EXPECT_EQ(written(again), out);
    ++checked;
  }
  EXPECT_GT(checked, 90);
}

TEST(ConfigKeys, EveryAliasSetsItsKey) {
  int checked = 0;
  for (const KeyEntry& e : config_detail::key_table()) {
    if (e.status != KeyStatus::alias) continue;
    const KeyEntry* target = config_detail::find_key(e.alias_of);
    ASSERT_NE(target, nullptr);
    SCOPED_TRACE(std::string(e.path));
    json root = base_for(*target);
    if (target->status == KeyStatus::supported) {
      json value = other_value(*target);
      set_path(root, e.path, value);
      Config c = parse_config(text(root), "alias.json");
      EXPECT_TRUE(c.warnings.empty()) << "aliases are silent: " << c.warnings.front();
      json out = written(c);
      const json* back = get_path(out, target->path);
      ASSERT_NE(back, nullptr);
      EXPECT_EQ(*back, value);
      // Both names at once: an error naming both.
      set_path(root, target->path, value);
      try {
        parse_config(text(root), "alias.json");
        ADD_FAILURE() << "both names accepted";
      } catch (const ConfigError& err) {
        std::string m = err.what();
        EXPECT_NE(m.find(std::string(config_detail::leaf_name(e.path))), std::string::npos) << m;
        EXPECT_NE(m.find("keep one"), std::string::npos) << m;
      }
    } else {
      // An alias of an ignored key: accepted, with the ignored key's warning when set.
      json def = json::parse(target->default_json);
      set_path(root, e.path, def.is_boolean() ? json(!def.get<bool>()) : json(def.get<int64_t>() + 1));
      Config c = parse_config(text(root), "alias.json");
      EXPECT_TRUE(has_warning(c, "ignored"));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 9) << "the nine short names of DeepSpeed's stage3_* keys";
}

TEST(ConfigKeys, DeprecatedKeys) {
  auto check = [](const std::string& text, const std::string& warning) {
    Config c = parse_config(text, "old.json");
    EXPECT_TRUE(has_warning(c, warning)) << text;
    return c;
  };
  Config c = check(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})", "zero_optimization.cpu_offload");
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::cpu);
  c = check(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true, "cpu_offload": true,
               "cpu_offload_use_pin_memory": true}})",
            "zero_optimization.cpu_offload_use_pin_memory");
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::cpu);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  c = check(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": false}})", "cpu_offload_param");
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::none);
  c = check(R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})",
            "stage3_gather_fp16_weights_on_model_save");
  EXPECT_TRUE(c.zero.gather_16bit_weights_on_model_save);
  c = check(R"({"aio": {"thread_count": 3}})", "aio.thread_count");
  EXPECT_EQ(c.aio.intra_op_parallelism, 3);
  c = check(R"({"bfloat16": {"enabled": true}})", "bfloat16");
  EXPECT_TRUE(c.bf16.enabled);
  c = check(R"({"zero_optimization": true, "allgather_size": 2e8})", "boolean form is deprecated");
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);
  EXPECT_TRUE(has_warning(c, "allgather_size"));
  c = check(R"({"zero_optimization": false})", "boolean form");
  EXPECT_EQ(c.zero.stage, 0);

  // Deprecated and new name together: an error naming both.
  auto refuse = [](const std::string& text, const std::vector<std::string>& parts) {
    try {
      parse_config(text, "old.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      std::string m = e.what();
      for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m;
    }
  };
  refuse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
         {"zero_optimization.offload_optimizer", "zero_optimization.cpu_offload", "keep one"});
  refuse(R"({"aio": {"thread_count": 2, "intra_op_parallelism": 2}})",
         {"aio.thread_count", "aio.intra_op_parallelism"});
  refuse(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", {"bf16", "bfloat16", "keep one"});
  refuse(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": true,
            "stage3_gather_fp16_weights_on_model_save": true}})",
         {"stage3_gather_fp16_weights_on_model_save", "keep one"});
  refuse(R"({"bfloat16": {"enabeld": true}})", {"bfloat16.enabeld", "did you mean \"enabled\"?"});
  refuse(R"({"zero_optimization": {"cpu_offload": "yes"}})", {"zero_optimization.cpu_offload", "true or false"});
  // The old form of parameter offload below stage 3: ignored as DeepSpeed ignores it, with a warning naming it.
  c = check(R"({"zero_optimization": {"stage": 2, "cpu_offload_param": true}})",
            "zero_optimization.cpu_offload_param: ignored at zero_optimization.stage 2");
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::none);

  // Every deprecated entry of the table is exercised above.
  std::set<std::string> covered = {"zero_optimization.cpu_offload",
                                   "zero_optimization.cpu_offload_param",
                                   "zero_optimization.cpu_offload_use_pin_memory",
                                   "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                                   "aio.thread_count",
                                   "bfloat16",
                                   "allgather_size"};
  for (const KeyEntry& e : config_detail::key_table()) {
    if (e.status == KeyStatus::deprecated) {
      EXPECT_TRUE(covered.count(std::string(e.path))) << e.path;
    }
  }
}

TEST(ConfigKeys, EveryIgnoredKeyWarnsOnlyWhenSet) {
  int checked = 0;
  for (const KeyEntry& e : config_detail::key_table()) {
    if (e.status != KeyStatus::ignored) continue;
    SCOPED_TRACE(std::string(e.path));
    json root = base_for(e);
    json active;
    json off;
    bool has_off = true;
    switch (e.when) {
      case config_detail::When::not_default:
        off = e.default_json.empty() ? json() : json::parse(e.default_json);
        if (off.is_boolean()) {
          active = !off.get<bool>();
        } else if (off.is_number()) {
          active = off.get<double>() + 1;
        } else if (off.is_null()) {
          active = e.type == "boolean" ? json(true) : e.type == "integer" ? json(3) : json("x");
          has_off = false;
        } else {
          active = "something-else";
        }
        break;
      case config_detail::When::enabled:
        active = {{"enabled", true}};
        off = {{"enabled", false}};
        break;
      case config_detail::When::present:
        active = e.type == "object" ? json{{"some_option", 1}} : e.type == "integer" ? json(7) : json("info");
        off = json::object();
        has_off = e.type == "object";
        break;
      case config_detail::When::above_one:
        active = 2;
        off = 1;
        break;
    }
    set_path(root, e.path, active);
    Config c = parse_config(text(root), "ignored.json");
    EXPECT_TRUE(has_warning(c, std::string(e.path) + ": ignored")) << text(root);
    if (has_off) {
      set_path(root, e.path, off);
      c = parse_config(text(root), "ignored.json");
      EXPECT_FALSE(has_warning(c, std::string(e.path))) << text(root);
    }
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST(ConfigKeys, EveryRefusedKeyRefusesOnlyWhenSet) {
  int checked = 0;
  for (const KeyEntry& e : config_detail::key_table()) {
    if (e.status != KeyStatus::refused) continue;
    SCOPED_TRACE(std::string(e.path));
    json root = base_for(e);
    json active, off;
    bool has_off = true;
    switch (e.when) {
      case config_detail::When::not_default: {
        off = e.default_json.empty() ? json() : json::parse(e.default_json);
        if (off.is_boolean()) {
          active = !off.get<bool>();
        } else if (off.is_number()) {
          active = off.get<int64_t>() + 9;
        } else if (off.is_string()) {
          active = "sum";
        } else {
          active = 1.0;
          has_off = false;
        }
        break;
      }
      case config_detail::When::enabled:
        active = {{"enabled", true}};
        off = {{"enabled", false}};
        break;
      case config_detail::When::present:
        active = e.type == "object" ? json{{"x", 1}} : e.type == "string" ? json("bf16") : json(1.0);
        has_off = false;
        break;
      case config_detail::When::above_one:
        active = e.type == "object" ? json{{"autotp_size", 2}} : json(2);
        off = e.type == "object" ? json{{"autotp_size", 1}} : json(1);
        break;
    }
    set_path(root, e.path, active);
    try {
      parse_config(text(root), "refused.json");
      ADD_FAILURE() << "accepted " << text(root);
    } catch (const ConfigError& err) {
      std::string m = err.what();
      EXPECT_EQ(m.rfind(std::string(e.path) + ": ", 0), 0u) << m;
      EXPECT_NE(m.find("not supported"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string(e.doc)), std::string::npos) << "the message says why: " << m;
    }
    if (has_off) {
      set_path(root, e.path, off);
      EXPECT_NO_THROW(parse_config(text(root), "refused.json")) << text(root);
    }
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(ConfigKeys, DocsFileIsTheTablesOutput) {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run under ctest, or set ZERO3_SOURCE_DIR";
  std::ifstream in(std::string(src) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::stringstream file;
  file << in.rdbuf();
  EXPECT_TRUE(file.str() == config_reference_markdown())
      << "docs/config.md differs from the key table: run `build/bin/zero3 config docs > docs/config.md`";
}

TEST(ConfigKeys, DocsCoverEveryKey) {
  std::string md = config_reference_markdown();
  for (const KeyEntry& e : config_detail::key_table()) {
    EXPECT_NE(md.find("| `" + std::string(e.path) + "` |"), std::string::npos) << e.path;
  }
}

// The one table of config keys. Every key zero3 knows (DeepSpeed's, their aliases and deprecated names,
// and the zero3 section) is one KeyEntry: its path, type, DeepSpeed's default, what zero3 does with it,
// a line of documentation, and how to read it into Config and write it back. The reader
// (config_reader.cpp), the JSON writer (config_writer.cpp) and docs/config.md (config_docs.cpp) all walk
// this table, so a key cannot be read without being documented, nor documented without being read.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_value.hpp"
#include "zero3/config.hpp"

namespace zero3::config_detail {

enum class KeyStatus {
  supported,   // read into Config and acted on
  alias,       // another accepted name of `alias_of`, silently
  deprecated,  // an old name of `alias_of` (or an old form of it): accepted with a warning
  ignored,     // accepted, no effect; a warning when set to anything but its default
  refused,     // an error when it asks for the feature (see `when`); its "off" value is accepted
};

// When an ignored key warns, or a refused key is an error.
enum class When {
  not_default,  // the value differs from `default_json`
  enabled,      // an object whose "enabled" is true
  present,      // any value other than null or {}
  above_one,    // a number greater than 1 (sizes where 1 means "off")
};

using ApplyFn = void (*)(ReadContext& ctx, const Value& v);
// The value to write for the key, or nullopt to leave it out (not applicable to this config).
using EmitFn = std::optional<nlohmann::ordered_json> (*)(const Config& c);

struct KeyEntry {
  std::string_view path;          // "zero_optimization.offload_param.device"
  std::string_view type;          // for people: "boolean", "integer", "number", "string", "object", ...
  std::string_view default_json;  // DeepSpeed's default as a JSON literal; "" when there is none
  KeyStatus status = KeyStatus::supported;
  std::string_view doc;            // one line; for ignored/refused keys it says why
  std::string_view alias_of = {};  // full path of the key this one names (alias/deprecated)
  When when = When::not_default;   // ignored/refused only
  bool auto_ok = false;            // "auto" is accepted (Hugging Face style) and resolved by resolve()
  std::string_view only_for = {};  // space-separated values of the section's "type" this key belongs to
  ApplyFn apply = nullptr;         // supported/deprecated values; sections have none
  EmitFn emit = nullptr;           // supported values written by to_json

  bool is_section() const { return type == "object" || type == "object or boolean"; }
};

// Every entry, sections before their children, in the order docs/config.md and to_json use.
const std::vector<KeyEntry>& key_table();

// The entry with exactly this path, or nullptr.
const KeyEntry* find_key(std::string_view path);

// The entries directly under `section` ("" for the top level).
std::vector<const KeyEntry*> children_of(std::string_view section);

// The last component of a path ("zero_optimization.stage" -> "stage").
std::string_view leaf_name(std::string_view path);

// The section part of a path ("zero_optimization.stage" -> "zero_optimization", "steps_per_print" -> "").
std::string_view parent_of(std::string_view path);

// DeepSpeed's name of a scheduler type ("WarmupLR"), "" for none.
std::string_view scheduler_type_name(SchedulerType type);

}  // namespace zero3::config_detail

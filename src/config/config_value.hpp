// One JSON value of the config at a key path, with typed readers that throw ConfigError naming the path,
// the value and what was expected. Internal to the config reader.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero3/config.hpp"

namespace zero3::config_detail {

// "<path>: <message> (in <source>)": the one shape of every config error.
std::string error_text(std::string_view path, std::string_view message, std::string_view source);

// What the reader carries while it walks one file.
struct ReadContext {
  ReadContext(Config& c, std::string src) : config(c), source(std::move(src)) {}

  Config& config;
  std::string source;
  // Canonical key path -> the name it was given under, to refuse one setting given under two names.
  std::map<std::string, std::string> given;
  // zero_optimization.cpu_offload / cpu_offload_param / cpu_offload_use_pin_memory (deprecated forms).
  bool cpu_offload = false, cpu_offload_param = false;
  std::optional<bool> cpu_offload_use_pin_memory;
  bool warmup_max_lr_given = false;
  bool cycle_second_stair_count_given = false;

  void warn(std::string message);
  // A reading worth saying but no warning (0 read as the largest size): logged at info level on rank 0.
  void note(const std::string& message) const;
  void mark_auto(std::string path);
};

class Value {
 public:
  Value(const nlohmann::json& json, std::string path, const ReadContext& ctx)
      : json_(json), path_(std::move(path)), ctx_(ctx) {}

  const nlohmann::json& json() const { return json_; }
  const std::string& path() const { return path_; }
  bool is_auto() const { return json_.is_string() && json_.get_ref<const std::string&>() == "auto"; }

  // true or false only (no 0/1, no "true").
  bool as_bool() const;
  // An integer, or a number written with an exponent or a ".0" that is whole (5e8, 1e9, 4.0).
  int64_t as_int(int64_t min = std::numeric_limits<int64_t>::min(),
                 int64_t max = std::numeric_limits<int64_t>::max()) const;
  // A finite number within [min, max].
  double as_number(double min = -std::numeric_limits<double>::infinity(),
                   double max = std::numeric_limits<double>::infinity()) const;
  std::string as_string() const;
  // One of `choices`; returns the choice's own spelling (so "warn" given case-insensitively returns "Warn").
  std::string as_choice(const std::vector<std::string_view>& choices, bool ignore_case = false) const;
  // "fp32" | "fp16" | "bf16" and the other spellings DeepSpeed accepts (float32, float16, half, bfloat16, ...).
  DType as_dtype() const;

  // Throws "<path>: got <value>, expected <expected> (in <source>)".
  [[noreturn]] void fail(std::string_view expected) const;
  // Throws "<path>: <message> (in <source>)".
  [[noreturn]] void fail_with(std::string_view message) const;

 private:
  const nlohmann::json& json_;
  std::string path_;
  const ReadContext& ctx_;
};

// The value as it is written in a message: compact JSON, strings quoted, at most 80 characters ("..."
// ends a longer one) and 8 levels deep ("[...]", "{...}" below), whatever the size and depth of the value.
std::string show(const nlohmann::json& json);

// `text` itself, or its first bytes and "..." when it is longer than `max` bytes (cut between UTF-8
// characters), with control characters written \u00XX: user-written names and messages quoted inside an
// error stay short and printable.
std::string shorten(std::string_view text, size_t max = 64);

}  // namespace zero3::config_detail

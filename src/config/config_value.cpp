#include "config/config_value.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::config_detail {

std::string error_text(std::string_view path, std::string_view message, std::string_view source) {
  std::string s(path);
  s += ": ";
  s += message;
  if (!source.empty()) {
    s += " (in ";
    s += source;
    s += ")";
  }
  return s;
}

void ReadContext::warn(std::string message) { config.warnings.push_back(std::move(message)); }

void ReadContext::note(const std::string& message) const { log::info_rank0(source, ": ", message); }

void ReadContext::mark_auto(std::string path) {
  if (std::find(config.auto_keys.begin(), config.auto_keys.end(), path) == config.auto_keys.end()) {
    config.auto_keys.push_back(std::move(path));
  }
}

namespace {

constexpr size_t kShowChars = 80;
constexpr int kShowDepth = 8;

// The longest prefix of `text` of at most `max` bytes that does not end inside a UTF-8 character.
std::string_view utf8_prefix(std::string_view text, size_t max) {
  if (text.size() <= max) return text;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

std::string json_string(std::string_view text) {
  // Parsed text is valid UTF-8 and the prefix ends between characters; a value built by a program may
  // still hold invalid UTF-8, which is replaced rather than thrown about.
  return nlohmann::json(std::string(utf8_prefix(text, kShowChars)))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Appends compact JSON, stopping once `out` holds more than kShowChars (the caller cuts it), so a value
// of any size costs no more than that, and the recursion is at most kShowDepth deep.
void put(std::string& out, const nlohmann::json& json, int depth) {
  if (json.is_array() || json.is_object()) {
    const bool array = json.is_array();
    if (json.empty()) {
      out += array ? "[]" : "{}";
      return;
    }
    if (depth >= kShowDepth) {
      out += array ? "[...]" : "{...}";
      return;
    }
    out += array ? '[' : '{';
    bool first = true;
    for (auto it = json.begin(); it != json.end() && out.size() <= kShowChars; ++it) {
      if (!first) out += ',';
      first = false;
      if (!array) out += json_string(it.key()) + ':';
      put(out, *it, depth + 1);
    }
    out += array ? ']' : '}';
  } else if (json.is_string()) {
    out += json_string(json.get_ref<const std::string&>());
  } else {
    out += json.dump();
  }
}

}  // namespace

std::string show(const nlohmann::json& json) {
  std::string s;
  put(s, json, 0);
  if (s.size() > kShowChars) s = std::string(utf8_prefix(s, kShowChars - 3)) + "...";
  return s;
}

std::string shorten(std::string_view text, size_t max) {
  std::string_view kept = text.size() <= max ? text : utf8_prefix(text, max > 3 ? max - 3 : 0);
  std::string s;
  for (char ch : kept) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {  // a NUL would end the message where it is printed; escapes would act
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      s += esc;
    } else {
      s += ch;
    }
  }
  if (kept.size() < text.size()) s += "...";
  return s;
}

void Value::fail(std::string_view expected) const {
  std::string message = "got " + show(json_) + ", expected ";
  message += expected;
  throw ConfigError(error_text(path_, message, ctx_.source));
}

void Value::fail_with(std::string_view message) const { throw ConfigError(error_text(path_, message, ctx_.source)); }

bool Value::as_bool() const {
  if (!json_.is_boolean()) fail("true or false");
  return json_.get<bool>();
}

namespace {

std::string range_text(const char* what, int64_t min, int64_t max) {
  constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  std::string s = what;
  if (min != lo && max != hi) return s + " from " + std::to_string(min) + " to " + std::to_string(max);
  if (min != lo) return s + " >= " + std::to_string(min);
  if (max != hi) return s + " <= " + std::to_string(max);
  return s;
}

std::string number_text(double v) {
  nlohmann::json j = v;
  return j.dump();
}

}  // namespace

int64_t Value::as_int(int64_t min, int64_t max) const {
  const std::string expected = range_text("an integer", min, max);
  int64_t v = 0;
  if (json_.is_number_unsigned()) {
    uint64_t u = json_.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(expected);
    v = static_cast<int64_t>(u);
  } else if (json_.is_number_integer()) {
    v = json_.get<int64_t>();
  } else if (json_.is_number_float()) {
    double d = json_.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) {
      fail(expected + " (integers may be written as 5e8 or 1e9, but this one has a fraction)");
    }
    // 2^63 itself does not fit; every double below it converts exactly.
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) fail(expected);
    v = static_cast<int64_t>(d);
  } else {
    fail(expected);
  }
  if (v < min || v > max) fail(expected);
  return v;
}

double Value::as_number(double min, double max) const {
  std::string expected = "a number";
  if (std::isfinite(min) && std::isfinite(max)) {
    expected += " from " + number_text(min) + " to " + number_text(max);
  } else if (std::isfinite(min)) {
    expected += " >= " + number_text(min);
  } else if (std::isfinite(max)) {
    expected += " <= " + number_text(max);
  }
  if (!json_.is_number()) fail(expected);
  double d = json_.get<double>();
  if (!std::isfinite(d) || d < min || d > max) fail(expected);
  return d;
}

std::string Value::as_string() const {
  if (!json_.is_string()) fail("a string");
  return json_.get<std::string>();
}

namespace {

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string choices_text(const std::vector<std::string_view>& choices) {
  std::string s = "one of ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) s += i + 1 == choices.size() ? " or " : ", ";
    s += '"';
    s += choices[i];
    s += '"';
  }
  return s;
}

}  // namespace

std::string Value::as_choice(const std::vector<std::string_view>& choices, bool ignore_case) const {
  std::string expected = choices_text(choices);
  if (ignore_case) expected += " (any case)";
  if (!json_.is_string()) fail(expected);
  const std::string& s = json_.get_ref<const std::string&>();
  for (std::string_view c : choices) {
    if (ignore_case ? equal_ignoring_case(s, c) : s == c) return std::string(c);
  }
  fail(expected);
}

DType Value::as_dtype() const {
  static const char* expected = "\"fp32\", \"fp16\" or \"bf16\"";
  if (!json_.is_string()) fail(expected);
  std::string s = json_.get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  // DeepSpeed's DtypeEnum spellings, with and without "torch.".
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "fp32" || s == "float32" || s == "float") return DType::f32;
  if (s == "fp16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  fail(expected);
}

}  // namespace zero3::config_detail

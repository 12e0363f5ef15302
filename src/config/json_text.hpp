// DeepSpeed JSON text -> nlohmann::json, accepting what DeepSpeed's hjson reader accepts in practice:
// // and /* */ and # comments, trailing commas. Duplicate keys are an error (hjson keeps the last one
// silently in most readers; DeepSpeed refuses them). Internal to the config reader.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace zero3::config_detail {

// Blanks out comments and trailing commas outside strings, keeping every other byte (and every newline)
// where it was, so positions in the result are positions in the input. Throws ConfigError
// ("<source>:<line>:<col>: ...") for an unterminated comment.
std::string strip_comments_and_trailing_commas(const std::string& text, const std::string& source);

// Arrays and objects nest at most this deep (DeepSpeed configs nest 3 or 4 levels).
inline constexpr int kMaxConfigDepth = 256;

// Parses the text (after stripping). Throws ConfigError: "<source>:<line>:<col>: JSON syntax error: ...",
// "<key path>: key given twice in the same object ... (in <source>)", "<key path>: nested deeper than
// 256 ..." or "<key path>: the number 1e400 is out of range ...".
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

// 1-based line and column of a byte offset.
struct TextPosition {
  size_t line = 1, column = 1;
};
TextPosition position_of(const std::string& text, size_t offset);

}  // namespace zero3::config_detail

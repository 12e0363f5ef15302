#include "config/json_text.hpp"

#include <cstdio>
#include <set>
#include <vector>

#include "config/config_value.hpp"
#include "zero3/error.hpp"

namespace zero3::config_detail {

TextPosition position_of(const std::string& text, size_t offset) {
  TextPosition p;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++p.line;
      p.column = 1;
    } else {
      ++p.column;
    }
  }
  return p;
}

namespace {

std::string where(const std::string& text, const std::string& source, size_t offset) {
  TextPosition p = position_of(text, offset);
  return source + ":" + std::to_string(p.line) + ":" + std::to_string(p.column);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

std::string strip_comments_and_trailing_commas(const std::string& text, const std::string& source) {
  std::string out = text;
  const size_t n = out.size();
  // Pass 1: comments. Replaced by spaces (newlines kept) so that line:column positions stay true.
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = out[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '#' || (c == '/' && i + 1 < n && out[i + 1] == '/')) {
      while (i < n && out[i] != '\n') out[i++] = ' ';
    } else if (c == '/' && i + 1 < n && out[i + 1] == '*') {
      size_t start = i;
      out[i++] = ' ';
      out[i++] = ' ';
      while (i < n && !(out[i] == '*' && i + 1 < n && out[i + 1] == '/')) {
        if (out[i] != '\n') out[i] = ' ';
        ++i;
      }
      if (i >= n) throw ConfigError(where(text, source, start) + ": a /* comment is never closed");
      out[i++] = ' ';
      out[i] = ' ';
    }
  }
  // Pass 2: a comma followed only by white space and a closing bracket is dropped.
  in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = out[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == ',') {
      size_t j = i + 1;
      while (j < n && is_space(out[j])) ++j;
      if (j < n && (out[j] == '}' || out[j] == ']')) out[i] = ' ';
    }
  }
  return out;
}

namespace {

// Follows the parse to know where it is, to find a key given twice (nlohmann keeps the last of two equal
// keys without a word; a config where one of them silently wins is a bug waiting to happen), to stop
// nesting deeper than kMaxConfigDepth before anything recurses over it, and to name the key of a value
// the parser refuses.
class StructureChecker {
 public:
  explicit StructureChecker(const std::string& source) : source_(source) {}

  bool on_event(nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        next_element();
        if (frames_.size() >= static_cast<size_t>(kMaxConfigDepth)) {
          throw ConfigError(error_text(path(0),
                                       "arrays and objects nested more than " + std::to_string(kMaxConfigDepth) +
                                           " levels deep, the most the config reader takes (DeepSpeed "
                                           "configs nest 3 or 4)",
                                       source_));
        }
        frames_.push_back({event == E::object_start, {}, {}, -1});
        break;
      case E::object_end:
      case E::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case E::key: {
        if (frames_.empty()) break;
        Frame& top = frames_.back();
        const std::string& key = parsed.get_ref<const std::string&>();
        top.current = key;
        if (!top.keys.insert(key).second && duplicate_.empty()) duplicate_ = path(0);
        break;
      }
      case E::value:
        next_element();
        break;
    }
    return true;
  }

  const std::string& duplicate() const { return duplicate_; }

  // The path of the value the parser reads next ("zero_optimization.reduce_bucket_size", "a.b[3]"), for a
  // value it refuses before any event names it.
  std::string pending_path() const { return path(1); }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;
    std::string current;
    int64_t index;  // arrays: the element being read
  };

  void next_element() {
    if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().index;
  }

  std::string component(const Frame& f, int64_t array_bump) const {
    if (f.is_object) return shorten(f.current);
    return "[" + std::to_string(f.index + array_bump) + "]";
  }

  // The path to the current value; an array at the innermost level counts `array_bump` elements ahead.
  // Deep paths show their first and last levels only.
  std::string path(int64_t array_bump) const {
    constexpr size_t kHead = 8;
    std::string p;
    auto add = [&](size_t i) {
      const Frame& f = frames_[i];
      std::string c = component(f, i + 1 == frames_.size() ? array_bump : 0);
      if (f.is_object && !p.empty()) p += '.';
      p += c;
    };
    for (size_t i = 0; i < frames_.size(); ++i) {
      if (frames_.size() > kHead + 2 && i == kHead) {
        p += "...(" + std::to_string(frames_.size() - kHead - 1) + " levels)...";
        i = frames_.size() - 1;
      }
      add(i);
    }
    return p;
  }

  const std::string& source_;
  std::vector<Frame> frames_;
  std::string duplicate_;
};

// "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ..." -> line, column, rest.
std::string describe_parse_error(const nlohmann::json::parse_error& e, const std::string& text,
                                 const std::string& source) {
  std::string what = e.what();
  size_t line = 0, column = 0;
  std::string detail = what;
  size_t at = what.find("line ");
  if (at != std::string::npos && std::sscanf(what.c_str() + at, "line %zu, column %zu", &line, &column) == 2) {
    size_t colon = what.find(": ", at);
    if (colon != std::string::npos) detail = what.substr(colon + 2);
  } else {
    TextPosition p = position_of(text, e.byte > 0 ? e.byte - 1 : 0);
    line = p.line;
    column = p.column;
    size_t colon = what.find("] ");
    if (colon != std::string::npos) detail = what.substr(colon + 2);
  }
  // nlohmann quotes the token it stopped at ("last read: '...'"), which can be a whole long string.
  return source + ":" + std::to_string(line) + ":" + std::to_string(column) +
         ": JSON syntax error: " + shorten(detail, 200);
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  // nlohmann's lexer takes a NUL byte for the end of the input and would ignore what follows it.
  if (size_t nul = text.find('\0'); nul != std::string::npos) {
    throw ConfigError(where(text, source, nul) + ": a NUL byte, expected JSON text (is this a binary file?)");
  }
  std::string clean = strip_comments_and_trailing_commas(text, source);
  if (clean.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw ConfigError(source + ": no JSON in it (empty, or only comments), expected a JSON object {...}");
  }
  StructureChecker checker(source);
  nlohmann::json::parser_callback_t callback = [&checker](int /*depth*/, nlohmann::json::parse_event_t event,
                                                          nlohmann::json& parsed) {
    return checker.on_event(event, parsed);
  };
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(clean, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(describe_parse_error(e, clean, source));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: "number overflow parsing '1e400'", a number beyond the range of a double.
    std::string what = e.what();
    std::string message = shorten(what, 200);
    size_t open = what.find('\''), close = what.rfind('\'');
    if (e.id == 406 && open != std::string::npos && close > open) {
      message = "the number " + shorten(what.substr(open + 1, close - open - 1), 40) +
                " is out of range: a number in a config must be a finite double (magnitude below about "
                "1.8e308)";
    }
    std::string path = checker.pending_path();
    if (path.empty()) throw ConfigError(source + ": " + message);
    throw ConfigError(error_text(path, message, source));
  }
  if (!checker.duplicate().empty()) {
    throw ConfigError(checker.duplicate() +
                      ": key given twice in the same object; JSON readers keep only one of them, so remove the "
                      "other (in " +
                      source + ")");
  }
  return root;
}

}  // namespace zero3::config_detail

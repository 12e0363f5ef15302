#include "config/json_text.hpp"

#include <cstdio>
#include <set>
#include <vector>

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

// Tracks the keys of every open object during parsing to find a key given twice. nlohmann keeps the last
// of two equal keys without a word; a config where one of them silently wins is a bug waiting to happen.
class DuplicateFinder {
 public:
  bool on_event(int /*depth*/, nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
        frames_.push_back({true, {}, {}});
        break;
      case E::array_start:
        frames_.push_back({false, {}, "[]"});
        break;
      case E::object_end:
      case E::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case E::key: {
        if (frames_.empty()) break;
        Frame& top = frames_.back();
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!top.keys.insert(key).second && duplicate_.empty()) {
          top.current = key;
          duplicate_ = path();
        }
        top.current = key;
        break;
      }
      case E::value:
        break;
    }
    return true;
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;
    std::string current;
  };
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.is_object) {
        if (!p.empty()) p += '.';
        p += f.current;
      } else {
        p += f.current;
      }
    }
    return p;
  }
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
  return source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": JSON syntax error: " + detail;
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  std::string clean = strip_comments_and_trailing_commas(text, source);
  DuplicateFinder finder;
  nlohmann::json::parser_callback_t callback = [&finder](int depth, nlohmann::json::parse_event_t event,
                                                         nlohmann::json& parsed) {
    return finder.on_event(depth, event, parsed);
  };
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(clean, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(describe_parse_error(e, clean, source));
  }
  if (!finder.duplicate().empty()) {
    throw ConfigError(finder.duplicate() +
                      ": key given twice in the same object; JSON readers keep only one of them, so remove the "
                      "other (in " +
                      source + ")");
  }
  return root;
}

}  // namespace zero3::config_detail

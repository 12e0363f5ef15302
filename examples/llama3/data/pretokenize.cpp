#include "data/pretokenize.hpp"

#include "data/unicode_classes.hpp"

namespace llama3 {
namespace {

bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// Each matcher returns the code point index one past the match starting at i, or i for no match.
struct Matcher {
  const std::vector<CodePoint>& cps;
  size_t n() const { return cps.size(); }
  char32_t at(size_t i) const { return cps[i].value; }
  bool letter(size_t i) const { return i < n() && is_letter(at(i)); }
  bool number(size_t i) const { return i < n() && is_number(at(i)); }
  bool space(size_t i) const { return i < n() && is_whitespace(at(i)); }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  size_t contraction(size_t i) const {
    if (at(i) != '\'' || i + 1 >= n()) return i;
    auto lower = [&](size_t k) -> char32_t {
      if (k >= n()) return 0;
      char32_t c = at(k);
      if (c == 0x17F) return 's';  // LATIN SMALL LETTER LONG S folds to s
      return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    };
    char32_t a = lower(i + 1), b = lower(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t word(size_t i) const {
    size_t j = i;
    if (!is_newline(at(j)) && !letter(j) && !number(j) && letter(j + 1)) ++j;
    if (!letter(j)) return i;
    while (letter(j)) ++j;
    return j;
  }

  // \p{N}{1,3}
  size_t digits(size_t i) const {
    size_t j = i;
    while (j < i + 3 && number(j)) ++j;
    return j;
  }

  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t punctuation(size_t i) const {
    auto other = [&](size_t k) { return k < n() && !space(k) && !letter(k) && !number(k); };
    size_t j = i;
    if (at(j) == ' ' && other(j + 1)) ++j;
    if (!other(j)) return i;
    while (other(j)) ++j;
    while (j < n() && is_newline(at(j))) ++j;
    return j;
  }

  // \s*[\r\n]+ : the whitespace run up to and including its last newline.
  size_t newlines(size_t i) const {
    size_t j = i, end = i;
    while (space(j)) {
      if (is_newline(at(j))) end = j + 1;
      ++j;
    }
    return end;
  }

  // \s+(?!\S) then \s+ : a whitespace run; when text follows, leave its last space for the next piece.
  size_t spaces(size_t i) const {
    size_t j = i;
    while (space(j)) ++j;
    if (j == i) return i;
    if (j == n() || j - i == 1) return j;
    return j - 1;
  }
};

}  // namespace

std::vector<std::string_view> pretokenize_llama3(std::string_view text) {
  std::vector<CodePoint> cps = decode_utf8(text);
  Matcher m{cps};
  std::vector<std::string_view> pieces;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = m.contraction(i);
    if (j == i) j = m.word(i);
    if (j == i) j = m.digits(i);
    if (j == i) j = m.punctuation(i);
    if (j == i) j = m.newlines(i);
    if (j == i) j = m.spaces(i);
    if (j == i) j = i + 1;  // unreachable for valid input: every code point matches some alternative
    pieces.push_back(text.substr(cps[i].begin, cps[j - 1].end - cps[i].begin));
    i = j;
  }
  return pieces;
}

}  // namespace llama3

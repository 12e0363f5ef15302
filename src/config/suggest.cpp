#include "config/suggest.hpp"

#include <algorithm>
#include <cctype>

namespace zero3::config_detail {

size_t edit_distance(std::string_view a, std::string_view b) {
  auto low = [](char c) { return std::tolower(static_cast<unsigned char>(c)); };
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = prev[j - 1] + (low(a[i - 1]) == low(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_name(std::string_view name, const std::vector<std::string_view>& candidates) {
  if (name.size() > kMaxSuggestedName) return "";  // and the quadratic distance is never paid for it
  std::string_view best;
  size_t best_distance = SIZE_MAX;
  for (std::string_view c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) return "";
  // Short names are close to many others by chance ("foo" is 2 edits from "aio"): allow one edit there.
  size_t limit = name.size() <= 4 ? 1 : std::max<size_t>(2, name.size() / 3);
  bool extends =
      name.size() >= 4 && (best.find(name) != std::string_view::npos || name.find(best) != std::string_view::npos);
  if (best_distance <= limit || extends) return std::string(best);
  // A name that is a substring of a candidate (e.g. "prefetch_bucket" of "stage3_prefetch_bucket_size").
  for (std::string_view c : candidates) {
    if (name.size() >= 6 && c.find(name) != std::string_view::npos) return std::string(c);
  }
  return "";
}

}  // namespace zero3::config_detail

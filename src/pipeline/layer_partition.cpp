#include "pipeline/layer_partition.hpp"

#include <algorithm>
#include <numeric>
#include <regex>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::pipeline {
namespace {

std::vector<int> uniform(int layers, int stages) {
  std::vector<int> bounds(static_cast<size_t>(stages) + 1, 0);
  const int base = layers / stages, extra = layers % stages;
  for (int s = 0; s < stages; ++s)
    bounds[static_cast<size_t>(s) + 1] = bounds[static_cast<size_t>(s)] + base + (s < extra);
  return bounds;
}

// Whether the layers fit into `stages` contiguous runs of at least one layer each, none heavier than `limit`; if so
// fills `bounds` with the cut where each stage takes as many layers as it can.
bool fits(const std::vector<int64_t>& weight, int stages, int64_t limit, std::vector<int>& bounds) {
  const int n = static_cast<int>(weight.size());
  bounds.assign(static_cast<size_t>(stages) + 1, 0);
  int at = 0;
  for (int s = 0; s < stages; ++s) {
    const int must_leave = stages - s - 1;  // one layer for every later stage
    int64_t sum = 0;
    int end = at;
    while (end < n - must_leave && (end == at || sum + weight[static_cast<size_t>(end)] <= limit)) {
      if (weight[static_cast<size_t>(end)] > limit) return false;
      sum += weight[static_cast<size_t>(end)];
      ++end;
    }
    bounds[static_cast<size_t>(s) + 1] = end;
    at = end;
  }
  return at == n;
}

// The smallest largest stage, by bisection over the limit.
std::vector<int> balanced(const std::vector<int64_t>& weight, int stages) {
  int64_t lo = *std::max_element(weight.begin(), weight.end());
  int64_t hi = std::accumulate(weight.begin(), weight.end(), int64_t{0});
  std::vector<int> bounds;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(weight, stages, mid, bounds)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  fits(weight, stages, lo, bounds);
  return bounds;
}

}  // namespace

std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method) {
  const int n = static_cast<int>(layers.size());
  if (stages < 1) throw ConfigError(log::concat("pipeline.stages: ", stages, "; expected at least 1"));
  if (stages > n) {
    throw ConfigError(log::concat("pipeline.stages: ", stages, " stages for ", n, " layer", n == 1 ? "" : "s",
                                  "; every stage needs at least one layer"));
  }
  if (method == "uniform") return uniform(n, stages);
  std::vector<int64_t> weight;
  if (method == "parameters") {
    for (const LayerInfo& l : layers) {
      if (l.parameters < 0) {
        throw ConfigError(
            log::concat("pipeline.partition \"parameters\": layer '", l.name, "' has ", l.parameters, " parameters"));
      }
      weight.push_back(l.parameters);
    }
  } else if (method.rfind("type:", 0) == 0 && method.size() > 5) {
    std::regex pattern;
    try {
      pattern = std::regex(method.substr(5), std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      throw ConfigError(log::concat("pipeline.partition: \"", method, "\": the regular expression does not compile (",
                                    e.what(), ")"));
    }
    for (const LayerInfo& l : layers) weight.push_back(std::regex_search(l.name, pattern) ? 1 : 0);
    if (std::accumulate(weight.begin(), weight.end(), int64_t{0}) == 0) {
      std::string names;
      for (int i = 0; i < n && i < 6; ++i) names += (i ? ", " : "") + layers[static_cast<size_t>(i)].name;
      if (n > 6) names += log::concat(", ... (", n, " layers)");
      throw ConfigError(log::concat("pipeline.partition: \"", method, "\" matches none of the layers (", names, ")"));
    }
  } else {
    throw ConfigError("pipeline.partition: \"" + method + "\"; expected \"parameters\", \"uniform\" or \"type:REGEX\"");
  }
  return balanced(weight, stages);
}

std::string describe_partition(const std::vector<LayerInfo>& layers, const std::vector<int>& bounds) {
  std::string s;
  for (size_t st = 0; st + 1 < bounds.size(); ++st) {
    const int a = bounds[st], b = bounds[st + 1];
    int64_t params = 0;
    for (int i = a; i < b; ++i) params += layers[static_cast<size_t>(i)].parameters;
    s += log::concat(st ? "; " : "", "stage ", st, ": ", layers[static_cast<size_t>(a)].name,
                     b - a > 1 ? " .. " + layers[static_cast<size_t>(b) - 1].name : std::string(), " (", b - a,
                     " layer", b - a == 1 ? "" : "s", ", ", params, " parameters)");
  }
  return s;
}

}  // namespace zero3::pipeline

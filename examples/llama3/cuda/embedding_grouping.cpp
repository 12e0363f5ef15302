// EmbeddingGrouping::build (cuda_ops.hpp): host code only, no CUDA call, so it is tested without a device.
#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "cuda/cuda_ops.hpp"
#include "zero3/error.hpp"

namespace llama3::cuda {

EmbeddingGrouping EmbeddingGrouping::build(const int32_t* host_ids, int64_t tokens) {
  if (tokens < 0 || tokens > std::numeric_limits<int32_t>::max()) {
    throw zero3::InvalidArgument("EmbeddingGrouping::build: tokens = " + std::to_string(tokens) +
                                 " outside [0, 2^31 - 1]");
  }
  for (int64_t i = 0; i < tokens; ++i) {
    if (host_ids[i] < 0) {
      throw zero3::InvalidArgument("EmbeddingGrouping::build: ids[" + std::to_string(i) +
                                   "] = " + std::to_string(host_ids[i]) + " is negative");
    }
  }
  EmbeddingGrouping g;
  g.token_ids.resize(static_cast<size_t>(tokens));
  std::iota(g.token_ids.begin(), g.token_ids.end(), 0);
  // Stable: the tokens of one id stay in increasing order.
  std::stable_sort(g.token_ids.begin(), g.token_ids.end(),
                   [host_ids](int32_t a, int32_t b) { return host_ids[a] < host_ids[b]; });
  g.offsets.push_back(0);
  for (int32_t pos = 0; pos < static_cast<int32_t>(tokens); ++pos) {
    const int32_t id = host_ids[g.token_ids[static_cast<size_t>(pos)]];
    if (g.rows.empty() || g.rows.back() != id) {
      if (!g.rows.empty()) g.offsets.push_back(pos);
      g.rows.push_back(id);
    }
  }
  if (!g.rows.empty()) g.offsets.push_back(static_cast<int32_t>(tokens));
  return g;
}

}  // namespace llama3::cuda

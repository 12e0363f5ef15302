// The token embedding's arithmetic, once for the CPU op (ops/embedding.*) and the CUDA kernels (cuda/embedding.cu):
// forward x[i, j] = table[ids[i], j]; backward adds dx[i, :] into row ids[i] of dtable, the tokens of one id in
// increasing token order (so the sum has the same bits however the work is split, as long as one id's column is
// added by one thread).
#pragma once

#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

// Where element (token i, column j) of the forward's output comes from in the (vocab, hidden) table.
ZERO3_HOST_DEVICE int64_t embedding_source(const int32_t* ids, int64_t i, int64_t j, int64_t hidden) {
  return static_cast<int64_t>(ids[i]) * hidden + j;
}

// dtable[id, j] after the tokens token_ids[t0..t1) of that id: `acc` (the element's value before) plus their
// dx[token, j] in order, each converted to Acc (a bf16 dx is widened to float exactly).
template <typename Acc, typename G>
ZERO3_HOST_DEVICE Acc embedding_grad_column(Acc acc, const G* dx, const int32_t* token_ids, int32_t t0, int32_t t1,
                                            int64_t hidden, int64_t j) {
  for (int32_t t = t0; t < t1; ++t) acc += static_cast<Acc>(dx[static_cast<int64_t>(token_ids[t]) * hidden + j]);
  return acc;
}

}  // namespace llama3::kernel_math

#include "ops/cross_entropy.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/gemm.hpp"
#include "ops/parallel.hpp"
#include "zero3/activation_plan.hpp"
#include "zero3/error.hpp"

namespace llama3 {

int64_t count_targets(const int32_t* targets, int64_t n, int64_t vocab) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] == kIgnoreIndex) continue;
    if (targets[i] < 0 || targets[i] >= vocab) {
      throw zero3::InvalidArgument("targets[" + std::to_string(i) + "] = " + std::to_string(targets[i]) +
                                   " is neither in [0, " + std::to_string(vocab) + ") nor the ignore index " +
                                   std::to_string(kIgnoreIndex));
    }
    ++count;
  }
  return count;
}

int64_t default_loss_chunk_rows(int64_t vocab) { return zero3::default_loss_chunk_rows(vocab); }

template <typename T>
CrossEntropyResult lm_head_cross_entropy(const T* x, const T* w, const int32_t* targets, int64_t n, int64_t hidden,
                                         int64_t vocab, T grad_scale, T* dx, T* dw, int64_t chunk_rows) {
  CrossEntropyResult result;
  result.count = count_targets(targets, n, vocab);
  if (chunk_rows <= 0) chunk_rows = default_loss_chunk_rows(vocab);
  chunk_rows = std::min(chunk_rows, std::max<int64_t>(n, 1));
  const bool backward = dx != nullptr;
  std::vector<T> logits(static_cast<size_t>(chunk_rows * vocab));
  std::vector<T> row_loss(static_cast<size_t>(chunk_rows));
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - r0);
    const T* xc = x + r0 * hidden;
    gemm<T>(false, true, rows, vocab, hidden, T(1), xc, hidden, w, hidden, T(0), logits.data(), vocab);
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelMinWork)
    for (int64_t r = 0; r < rows; ++r)
      row_loss[r] = cross_entropy_row(logits.data() + r * vocab, vocab, targets[r0 + r], grad_scale, backward);
    for (int64_t r = 0; r < rows; ++r) result.loss_sum += static_cast<double>(row_loss[r]);
    if (!backward) continue;
    // dx_c = dlogits_c W ; dW += dlogits_c^T x_c
    gemm<T>(false, false, rows, hidden, vocab, T(1), logits.data(), vocab, w, hidden, T(0), dx + r0 * hidden, hidden);
    if (dw != nullptr)
      gemm<T>(true, false, vocab, hidden, rows, T(1), logits.data(), vocab, xc, hidden, T(1), dw, hidden);
  }
  return result;
}

template CrossEntropyResult lm_head_cross_entropy<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                                                         int64_t, float, float*, float*, int64_t);
template CrossEntropyResult lm_head_cross_entropy<double>(const double*, const double*, const int32_t*, int64_t,
                                                          int64_t, int64_t, double, double*, double*, int64_t);

}  // namespace llama3

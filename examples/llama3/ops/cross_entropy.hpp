// Cross-entropy over the vocabulary with an ignore index, fused with the LM head and chunked over rows.
//
// For a row of logits x (vocab) and target y:  loss = log(sum_j exp(x_j - max)) - (x_y - max), the value
// torch.nn.functional.cross_entropy gives; its gradient is softmax(x) - onehot(y). Rows whose target is
// kIgnoreIndex (-100) contribute neither loss nor gradient.
//
// lm_head_cross_entropy never holds the (tokens, vocab) logits of the whole batch: it computes the logits of
// `chunk_rows` rows, turns them into loss and dlogits in place, and immediately adds that chunk's share to dW
// and writes the chunk's dx, so the peak is chunk_rows * vocab elements (a few hundred rows at vocab 128256).
#pragma once

#include <cstdint>

#include "kernel_math/cross_entropy_math.hpp"
#include "zero3/host_device.hpp"

namespace llama3 {

using kernel_math::kIgnoreIndex;  // -100, as torch's

// Returns the row's loss (0 for an ignored row) and, when write_grad, replaces the row by
// grad_scale * (softmax - onehot) (zeros for an ignored row). The terms are kernel_math/cross_entropy_math.hpp's,
// with the exponentials in double (ExactExp); the sums in element order.
//
// Accuracy at any vocabulary size: the max is exact; every exponential is taken of x_j - max formed exactly in
// double, and the sum of exponentials is accumulated in double (a float sum, one term after another, rounds the
// small terms away once it nears 1, which biases the loss low on a trained model's peaked rows). So the loss,
// each probability and the target's p - 1 (through expm1, without cancellation) are the exact values for the
// given logits rounded once to T, up to double's round-off (tests/test_ops.cpp measures it at 128,256 entries).
template <typename T>
ZERO3_HOST_DEVICE T cross_entropy_row(T* x, int64_t vocab, int32_t target, T grad_scale, bool write_grad) {
  namespace km = kernel_math;
  if (target == kIgnoreIndex) {
    if (write_grad)
      for (int64_t j = 0; j < vocab; ++j) x[j] = T(0);
    return T(0);
  }
  T mx = x[0];
  for (int64_t j = 1; j < vocab; ++j) mx = x[j] > mx ? x[j] : mx;
  km::CrossEntropySums sums;
  for (int64_t j = 0; j < vocab; ++j) km::cross_entropy_add<km::ExactExp>(sums, x[j], mx);
  const double m = static_cast<double>(mx);
  const double log_sum = km::cross_entropy_log_sum(sums.rest, sums.ties);
  const double dt = km::cross_entropy_target_shift(x[target], mx);
  if (write_grad) {
    for (int64_t j = 0; j < vocab; ++j) {
      x[j] = j == target ? km::cross_entropy_target_grad(dt, log_sum, grad_scale)
                         : km::ExactExp::grad(x[j], m, log_sum, grad_scale);
    }
  }
  return static_cast<T>(km::cross_entropy_loss(log_sum, dt));
}

struct CrossEntropyResult {
  double loss_sum = 0;  // sum of the per-row losses of the non-ignored rows (accumulated in double)
  int64_t count = 0;    // non-ignored rows
};

// x (n, hidden): the normalised final hidden states; w (vocab, hidden): lm_head.weight; targets (n).
// With dx != nullptr, also backward with dloss/dlogits = grad_scale * (softmax - onehot): dx (n, hidden) is
// overwritten, dw (vocab, hidden) accumulated (nullptr skips it). chunk_rows <= 0 picks a chunk of about
// 16 Mi logits. Throws zero3::InvalidArgument for a target outside [0, vocab) other than kIgnoreIndex.
template <typename T>
CrossEntropyResult lm_head_cross_entropy(const T* x, const T* w, const int32_t* targets, int64_t n, int64_t hidden,
                                         int64_t vocab, T grad_scale, T* dx, T* dw, int64_t chunk_rows);

// Rows with a target other than kIgnoreIndex; throws like lm_head_cross_entropy for an invalid one.
int64_t count_targets(const int32_t* targets, int64_t n, int64_t vocab);

// The chunk lm_head_cross_entropy uses for chunk_rows <= 0: zero3::default_loss_chunk_rows, which zero3's
// activation plan (zero3/activation_plan.hpp) counts.
int64_t default_loss_chunk_rows(int64_t vocab);

}  // namespace llama3

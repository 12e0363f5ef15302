// Row softmax with a causal mask, the kernel between attention's two GEMMs, and its backward, on the CPU (the terms:
// kernel_math/attention_math.hpp, which the CUDA fallback path runs too).
//
// A row of `len` scores of which the first `valid` are visible (query t sees keys 0..t: valid = t + 1) becomes
// probabilities in place: p_s = exp(x_s - max) / sum for s < valid, and exactly 0 for the masked tail, as
// Hugging Face's additive -inf mask followed by softmax gives. The scores arrive already scaled by
// 1/sqrt(head_dim). Arithmetic in T (float32 for the float model, as transformers' softmax(dtype=float32)); the
// sums in element order.
#pragma once

#include <cstdint>

#include "kernel_math/attention_math.hpp"
#include "zero3/host_device.hpp"

namespace llama3 {

// Returns the row's log-sum-exp (max + log(sum)), which backward uses to recompute p without storing it.
template <typename T>
ZERO3_HOST_DEVICE T causal_softmax_row(T* x, int64_t len, int64_t valid) {
  T mx = x[0];
  for (int64_t s = 1; s < valid; ++s) mx = x[s] > mx ? x[s] : mx;
  T sum = T(0);
  for (int64_t s = 0; s < valid; ++s) {
    x[s] = kernel_math::softmax_exp(x[s], mx);
    sum += x[s];
  }
  const T inv = kernel_math::softmax_inverse(sum);
  for (int64_t s = 0; s < valid; ++s) x[s] *= inv;
  for (int64_t s = valid; s < len; ++s) x[s] = T(0);
  return kernel_math::softmax_log_sum_exp(mx, sum);
}

// Recomputes probabilities from scaled scores and the saved log-sum-exp: p_s = exp(x_s - lse).
template <typename T>
ZERO3_HOST_DEVICE void causal_softmax_from_lse_row(T* x, int64_t len, int64_t valid, T lse) {
  for (int64_t s = 0; s < valid; ++s) x[s] = kernel_math::softmax_prob_from_lse(x[s], lse);
  for (int64_t s = valid; s < len; ++s) x[s] = T(0);
}

// dx_s = p_s * (dp_s - sum_r p_r dp_r), in place over dp. Masked entries have p = 0 and get 0.
template <typename T>
ZERO3_HOST_DEVICE void softmax_backward_row(const T* p, T* dp, int64_t len, int64_t valid) {
  T dot = T(0);
  for (int64_t s = 0; s < valid; ++s) dot += p[s] * dp[s];
  for (int64_t s = 0; s < valid; ++s) dp[s] = kernel_math::softmax_grad(p[s], dp[s], dot);
  for (int64_t s = valid; s < len; ++s) dp[s] = T(0);
}

}  // namespace llama3

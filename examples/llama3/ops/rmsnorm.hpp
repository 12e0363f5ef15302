// RMSNorm as Hugging Face's LlamaRMSNorm computes it, per row of n elements:
//
//   rstd = 1 / sqrt(mean(x^2) + eps),   y = w * (x * rstd)
//
// (in that order of rounding: the normalised row first, then the weight). Backward, with xhat = x * rstd:
//
//   dx = rstd * (w*dy - xhat * mean(w*dy*xhat)),   dw += sum over rows of dy * xhat
//
// The row functions are ZERO3_HOST_DEVICE: one CUDA block (or one OpenMP iteration) per row.
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3 {

// Writes y (may alias x) and returns rstd.
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_forward_row(const T* x, const T* w, T* y, int64_t n, T eps) {
  T ss = T(0);
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  T rstd = T(1) / std::sqrt(ss / static_cast<T>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * rstd);
  return rstd;
}

// dx = (or +=, when accumulate) the input gradient of one row.
template <typename T>
ZERO3_HOST_DEVICE void rmsnorm_backward_row(const T* x, const T* w, const T* dy, T rstd, T* dx, int64_t n,
                                            bool accumulate) {
  T dot = T(0);
  for (int64_t i = 0; i < n; ++i) dot += w[i] * dy[i] * (x[i] * rstd);
  T mean = dot / static_cast<T>(n);
  for (int64_t i = 0; i < n; ++i) {
    T g = rstd * (w[i] * dy[i] - (x[i] * rstd) * mean);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

// One row's contribution to dw[i]; the drivers sum it over rows.
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_weight_grad_term(T x, T dy, T rstd) {
  return dy * (x * rstd);
}

// rows x n. rstd (rows) may be nullptr when backward will not need it.
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t n, T eps);

// dx (rows x n) = or += input gradient; dw (n) += weight gradient (nullptr skips it).
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t n,
                      bool accumulate_dx);

}  // namespace llama3

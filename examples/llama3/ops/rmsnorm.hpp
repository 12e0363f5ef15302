// RMSNorm on the CPU, per row of n elements (the formulas and their order of rounding: kernel_math/rmsnorm_math.hpp,
// which the CUDA kernels run too):
//
//   rstd = 1 / sqrt(mean(x^2) + eps),   y = w * (x * rstd)
//   dx = rstd * (w*dy - xhat * mean(w*dy*xhat)),   dw += sum over rows of dy * xhat,   xhat = x * rstd
//
// The row functions add a row's terms in element order; one OpenMP iteration per row.
#pragma once

#include <cstdint>

#include "kernel_math/rmsnorm_math.hpp"
#include "zero3/host_device.hpp"

namespace llama3 {

// Writes y (may alias x) and returns rstd.
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_forward_row(const T* x, const T* w, T* y, int64_t n, T eps) {
  T ss = T(0);
  for (int64_t i = 0; i < n; ++i) ss += kernel_math::rmsnorm_square(x[i]);
  const T rstd = kernel_math::rmsnorm_rstd(ss, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = kernel_math::rmsnorm_output(x[i], w[i], rstd);
  return rstd;
}

// dx = (or +=, when accumulate) the input gradient of one row.
template <typename T>
ZERO3_HOST_DEVICE void rmsnorm_backward_row(const T* x, const T* w, const T* dy, T rstd, T* dx, int64_t n,
                                            bool accumulate) {
  T dot = T(0);
  for (int64_t i = 0; i < n; ++i) dot += kernel_math::rmsnorm_dot_term(x[i], w[i], dy[i], rstd);
  const T mean = kernel_math::rmsnorm_dot_mean(dot, n);
  for (int64_t i = 0; i < n; ++i) {
    const T g = kernel_math::rmsnorm_input_grad(x[i], w[i], dy[i], rstd, mean);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

// rows x n. rstd (rows) may be nullptr when backward will not need it.
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t n, T eps);

// dx (rows x n) = or += input gradient; dw (n) += weight gradient (nullptr skips it).
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t n,
                      bool accumulate_dx);

}  // namespace llama3

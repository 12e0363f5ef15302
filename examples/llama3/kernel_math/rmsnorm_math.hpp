// RMSNorm's arithmetic, once for the CPU op (ops/rmsnorm.*) and the CUDA kernels (cuda/norm_kernels.cu). Per row of
// n elements, as Hugging Face's LlamaRMSNorm computes it:
//
//   rstd = 1 / sqrt(sum(x^2) / n + eps),   y = w * (x * rstd)
//
// (in that order of rounding: the normalised element first, then the weight). Backward, with xhat = x * rstd:
//
//   mean = sum(w*dy*xhat) / n,   dx = rstd * (w*dy - xhat * mean),   dw += sum over rows of dy * xhat
//
// Each function is one element's term or one row's finishing step; the callers own the sums (the CPU op adds a
// row's terms in element order, a CUDA block in per-thread partials and a fixed tree), so the same formulas run in
// both and only the order of the additions differs.
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

// The term of sum(x^2).
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_square(T x) {
  return x * x;
}

template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_rstd(T sum_of_squares, int64_t n, T eps) {
  return T(1) / std::sqrt(sum_of_squares / static_cast<T>(n) + eps);
}

template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_output(T x, T w, T rstd) {
  return w * (x * rstd);
}

// The term of sum(w*dy*xhat), the row's projection of the output gradient on xhat.
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_dot_term(T x, T w, T dy, T rstd) {
  return w * dy * (x * rstd);
}

template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_dot_mean(T dot, int64_t n) {
  return dot / static_cast<T>(n);
}

// One element of the input gradient, given the row's rstd and rmsnorm_dot_mean.
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_input_grad(T x, T w, T dy, T rstd, T mean) {
  return rstd * (w * dy - (x * rstd) * mean);
}

// One row's term of dw[i].
template <typename T>
ZERO3_HOST_DEVICE T rmsnorm_weight_grad_term(T x, T dy, T rstd) {
  return dy * (x * rstd);
}

}  // namespace llama3::kernel_math

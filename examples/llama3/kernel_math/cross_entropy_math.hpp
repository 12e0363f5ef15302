// Cross-entropy's per-row arithmetic, once for the CPU op (ops/cross_entropy.hpp) and the CUDA kernel
// (cuda/cross_entropy.cu). For a row of logits x (vocab) and target y, with m = max_j x_j:
//
//   rest     = sum over x_j != m of exp(x_j - m),  ties = #{j : x_j = m}
//   log_sum  = log1p(rest + (ties - 1))          = log(sum_j exp(x_j - m)), its digits kept when rest is tiny
//   loss     = log_sum - (x_y - m)
//   grad_j   = grad_scale * exp(x_j - m - log_sum)          (j != y)
//   grad_y   = grad_scale * expm1((x_y - m) - log_sum)      (p_y - 1 without the cancellation)
//
// The max is exact; rest is accumulated in double by both. Where they differ is the exponential of a term, on
// purpose (the Exp policies below):
//   ExactExp     (the CPU op)      exp in double of x_j - m formed exactly in double, rounded once: the reference.
//   ShiftedExp   (the CUDA kernel) expf of the float-rounded difference, corrected by its double remainder
//                (exp_shifted): a few float units per term. A GPU's double-precision exp runs at 1/64 of its float
//                rate on the L40S (1/2 on the H100), and the kernel takes 2 x vocab exponentials per row.
// Both give the loss and every gradient element to about 1e-7 relative at Llama-3's 128,256 entries
// (tests/test_kernel_math_rows.cpp measures the kernel's against a compensated double reference and the CPU op).
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

inline constexpr int32_t kIgnoreIndex = -100;

// exp(x - base) for a float x and a double base: x - base is formed exactly in double and split into hi + lo
// (floats); exp(hi + lo) = expf(hi) * (1 + lo) to a few float units, so a large |x - base| costs no accuracy (expf
// of the float-rounded difference would be off by |x - base| * 6e-8 relative).
ZERO3_HOST_DEVICE float exp_shifted(float x, double base) {
  const double d = static_cast<double>(x) - base;
  const float hi = static_cast<float>(d);
  const float lo = static_cast<float>(d - static_cast<double>(hi));
  const float e = std::exp(hi);
  return e > 0.0f ? std::fma(e, lo, e) : e;  // e = 0: x - base below -104, or x = -inf (then lo is NaN)
}

// The CPU op's exponentials: in double, the probability rounded once to T.
struct ExactExp {
  template <typename T>
  ZERO3_HOST_DEVICE static double term(T x, double m) {
    return std::exp(static_cast<double>(x) - m);
  }
  template <typename T>
  ZERO3_HOST_DEVICE static T grad(T x, double m, double log_sum, T grad_scale) {
    return static_cast<T>(std::exp((static_cast<double>(x) - m) - log_sum) * static_cast<double>(grad_scale));
  }
};

// The CUDA kernel's exponentials: exp_shifted in float (logits are f32 there).
struct ShiftedExp {
  ZERO3_HOST_DEVICE static double term(float x, double m) { return static_cast<double>(exp_shifted(x, m)); }
  ZERO3_HOST_DEVICE static float grad(float x, double m, double log_sum, float grad_scale) {
    return exp_shifted(x, m + log_sum) * grad_scale;
  }
};

// The two sums of a row (or of a part of it: parts add).
struct CrossEntropySums {
  double rest = 0.0;
  double ties = 0.0;  // a count; exact in double
};

template <typename Exp, typename T>
ZERO3_HOST_DEVICE void cross_entropy_add(CrossEntropySums& s, T x, T mx) {
  if (x == mx) {
    s.ties += 1.0;
  } else {
    s.rest += Exp::term(x, static_cast<double>(mx));
  }
}

// log(sum_j exp(x_j - m)) from the row's sums.
ZERO3_HOST_DEVICE double cross_entropy_log_sum(double rest, double ties) { return std::log1p(rest + (ties - 1.0)); }

// x_y - m, exact in double.
template <typename T>
ZERO3_HOST_DEVICE double cross_entropy_target_shift(T x_target, T mx) {
  return static_cast<double>(x_target) - static_cast<double>(mx);
}

ZERO3_HOST_DEVICE double cross_entropy_loss(double log_sum, double target_shift) { return log_sum - target_shift; }

// The target's gradient, grad_scale * (p_y - 1); `target_shift` is cross_entropy_target_shift of the row. Every
// other logit's is Exp::grad(x, m, log_sum, grad_scale).
template <typename T>
ZERO3_HOST_DEVICE T cross_entropy_target_grad(double target_shift, double log_sum, T grad_scale) {
  return static_cast<T>(std::expm1(target_shift - log_sum) * static_cast<double>(grad_scale));
}

}  // namespace llama3::kernel_math

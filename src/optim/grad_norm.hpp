// Gradient helpers for the step: the squared L2 norm (for clipping), the Inf/NaN check (for skipping),
// and scaling (unscale by the loss scale, clip). The element functions are single-source; the range
// functions are the CPU drivers (OpenMP).
//
// Determinism: squared_l2_norm sums fixed chunks of kNormChunk elements in double, then adds the chunk
// sums in order, so the result does not depend on the number of threads.
#pragma once

#include <cstdint>
#include <cstring>

#include "zero3/host_device.hpp"

namespace zero3 {

inline constexpr int64_t kNormChunk = 1 << 15;

// True for +-Inf and NaN (exponent bits all ones), decided on the bits so fast-math cannot fold it away.
ZERO3_HOST_DEVICE bool is_non_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

ZERO3_HOST_DEVICE double squared(float x) {
  double d = static_cast<double>(x);
  return d * d;
}

// Sum of x[i]^2 over [0, n), accumulated in double. Inf/NaN propagate (the caller checks has_non_finite
// first, or tests the result). n >= 0.
double squared_l2_norm(const float* x, int64_t n);

// True when some x[i] in [0, n) is Inf or NaN.
bool has_non_finite(const float* x, int64_t n);

// x[i] *= factor over [0, n), in float.
void scale_in_place(float* x, int64_t n, float factor);

// DeepSpeed's clip coefficient: max_norm / (total_norm + 1e-6), applied only when it is below 1.
// Returns 1 when no clipping applies (max_norm <= 0 disables clipping).
inline double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace zero3

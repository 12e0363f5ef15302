// Element operations over the three element types, written once for host and device: the CPU backend
// runs them in OpenMP loops (src/device/cpu), the CUDA backend launches them.
//
// Arithmetic is in fp32; 16-bit results are rounded to nearest even by the dtype.hpp conversions.
#pragma once

#include <cstdint>

#include "zero3/dtype.hpp"
#include "zero3/host_device.hpp"

namespace zero3 {

// Element i of a buffer of type T, as fp32 (compile-time type: loops over one type pair stay plain loops).
template <DType T>
ZERO3_HOST_DEVICE float load_as_f32(const void* p, int64_t i) {
  if constexpr (T == DType::f32) return static_cast<const float*>(p)[i];
  if constexpr (T == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if constexpr (T == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return 0.0f;
}

template <DType T>
ZERO3_HOST_DEVICE void store_from_f32(void* p, int64_t i, float x) {
  if constexpr (T == DType::f32) static_cast<float*>(p)[i] = x;
  if constexpr (T == DType::bf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(x);
  if constexpr (T == DType::f16) static_cast<uint16_t*>(p)[i] = f32_to_f16(x);
}

// dst[i] = scale * src[i]   (a converting copy when scale == 1)
template <DType D, DType S>
ZERO3_HOST_DEVICE void scale_copy_element(void* dst, const void* src, float scale, int64_t i) {
  float x = load_as_f32<S>(src, i);
  store_from_f32<D>(dst, i, scale == 1.0f ? x : scale * x);
}

// dst[i] += scale * src[i]
template <DType D, DType S>
ZERO3_HOST_DEVICE void scale_add_element(void* dst, const void* src, float scale, int64_t i) {
  float x = load_as_f32<S>(src, i);
  float acc = load_as_f32<D>(dst, i);
  float sx = scale * x;
  store_from_f32<D>(dst, i, acc + sx);
}

// Element i of a buffer of type t, as fp32.
ZERO3_HOST_DEVICE float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

// Stores x into element i of a buffer of type t.
ZERO3_HOST_DEVICE void store_f32(void* p, DType t, int64_t i, float x) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = x;
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(x);
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(x);
      return;
  }
}

// True for +-Inf and NaN, decided on the exponent bits so that fast-math cannot fold it away.
ZERO3_HOST_DEVICE bool non_finite_f32(float x) { return (f32_bits(x) & 0x7f800000u) == 0x7f800000u; }

// The gradient statistics as the ranks exchange them (two floats, all-reduced): from acc = {sum of squares, Inf/NaN
// count} in double, out = {count, sum of squares} in float, the count raised to at least 1 when the sum of squares
// overflows float (the step is then skipped like one with an Inf/NaN gradient).
ZERO3_HOST_DEVICE void grad_stats_f32(const double* acc, float* out) {
  out[0] = static_cast<float>(acc[1]);
  out[1] = static_cast<float>(acc[0]);
  if (non_finite_f32(out[1]) && !(out[0] >= 1.0f)) out[0] = 1.0f;
}

}  // namespace zero3

// The SwiGLU activation's arithmetic, once for the CPU op (ops/swiglu.*) and the CUDA kernels
// (cuda/rope_swiglu_kernels.cu): h = silu(g) * u with silu(g) = g / (1 + exp(-g)) (torch's CPU silu), and its
// gradient with s = sigmoid(g):
//
//   dg = dh * u * (s * (1 + g * (1 - s))),   du = dh * (g * s)
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

template <typename T>
ZERO3_HOST_DEVICE T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

template <typename T>
ZERO3_HOST_DEVICE T swiglu_forward_elem(T g, T u) {
  return silu(g) * u;
}

template <typename T>
struct SwigluGrad {
  T dg;
  T du;
};

template <typename T>
ZERO3_HOST_DEVICE SwigluGrad<T> swiglu_backward_elem(T g, T u, T dh) {
  const T s = T(1) / (T(1) + std::exp(-g));
  return {dh * u * (s * (T(1) + g * (T(1) - s))), dh * (g * s)};
}

// The CUDA kernels' index space: rows * (inter / width) items of `width` consecutive elements of one row; item
// `index` starts at element `i` of row `row` (gate at gu[row, i], up at gu[row, inter + i]).
struct SwigluItem {
  int64_t row;
  int64_t i;
};

ZERO3_HOST_DEVICE SwigluItem swiglu_item(int64_t index, int64_t inter, int64_t width) {
  const int64_t groups = inter / width, row = index / groups;
  return {row, (index - row * groups) * width};
}

}  // namespace llama3::kernel_math

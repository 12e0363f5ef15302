// Rotary embeddings' arithmetic (Hugging Face's rotate_half convention), once for the CPU op (ops/rope.*) and the
// CUDA kernel (cuda/rope_swiglu_kernels.cu). For one head of head_dim elements, half = head_dim / 2, the pair
// (a, b) = (x_i, x_{i+half}) at a token whose table row holds cos_i, sin_i:
//
//   forward    (a cos - b sin,  b cos + a sin)
//   backward   (a cos + b sin,  b cos - a sin)     the transposed rotation, applied to the gradient
//
// and which pair a flat index of the CUDA kernel's grid-stride loop is.
#pragma once

#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

template <typename T>
struct RotatedPair {
  T lo;  // element i
  T hi;  // element i + half
};

template <typename T>
ZERO3_HOST_DEVICE RotatedPair<T> rope_rotate(T a, T b, T cos, T sin) {
  return {a * cos - b * sin, b * cos + a * sin};
}

template <typename T>
ZERO3_HOST_DEVICE RotatedPair<T> rope_rotate_back(T a, T b, T cos, T sin) {
  return {a * cos + b * sin, b * cos - a * sin};
}

// The CUDA kernel's index space: `total` items, one per `width` consecutive pairs of one (token, head), in the order
// token, head, pair.
struct RopeItems {
  int64_t width;
  int64_t groups;     // items per head: half / width
  int64_t per_token;  // items per token
  int64_t total;
};

ZERO3_HOST_DEVICE RopeItems rope_items(int64_t n_tokens, int64_t n_heads, int64_t half, int64_t width) {
  const int64_t groups = half / width, per_token = n_heads * groups;
  return {width, groups, per_token, n_tokens * per_token};
}

// Item `index` starts at pair `i` of head `head` of token `token`.
struct RopeItem {
  int64_t token;
  int64_t head;
  int64_t i;
};

ZERO3_HOST_DEVICE RopeItem rope_item(const RopeItems& items, int64_t index) {
  const int64_t token = index / items.per_token, rem = index - token * items.per_token;
  const int64_t head = rem / items.groups;
  return {token, head, (rem - head * items.groups) * items.width};
}

}  // namespace llama3::kernel_math

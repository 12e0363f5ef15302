// Rotary position embeddings in Hugging Face's rotate_half convention. For one head of d = head_dim elements,
// half = d/2, and a token at position p:
//
//   angle_i = p * inv_freq_i,   inv_freq_i = 1 / theta^(2i/d)   (i < half; Llama-3.1 "llama3" scaling rescales it)
//   out_i        = x_i * cos_i - x_{i+half} * sin_i
//   out_{i+half} = x_{i+half} * cos_i + x_i * sin_i
//
// Backward applies the transposed rotation (angle -> -angle). The rotation of a pair is kernel_math/rope_math.hpp's,
// which the CUDA kernel runs too. The frequencies and angles are computed in
// float32 the way transformers computes them (inv_freq in float32, angle = float(p) * inv_freq in float32),
// and cos/sin of that float angle are evaluated in double and rounded once: the table matches Hugging Face's
// to the last bit or one ulp, at every position, for any scalar type used by the model.
#pragma once

#include <cstdint>
#include <vector>

#include "kernel_math/rope_math.hpp"
#include "model_config.hpp"
#include "zero3/host_device.hpp"

namespace llama3 {

// The head_dim/2 inverse frequencies of `config` (rope_theta, and rope_scaling when present).
std::vector<float> rope_inv_freq(const ModelConfig& config);

// cos and sin for a batch of tokens: (n_tokens, half) each.
template <typename T>
struct RopeTable {
  int64_t n_tokens = 0;
  int64_t half = 0;
  std::vector<T> cos, sin;
};

// positions: n_tokens entries, each >= 0.
template <typename T>
RopeTable<T> make_rope_table(const std::vector<float>& inv_freq, const int32_t* positions, int64_t n_tokens);

// Rotates one head in place.
template <typename T>
ZERO3_HOST_DEVICE void rope_forward_head(T* x, const T* cos, const T* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const kernel_math::RotatedPair<T> r = kernel_math::rope_rotate(x[i], x[i + half], cos[i], sin[i]);
    x[i] = r.lo;
    x[i + half] = r.hi;
  }
}

// The gradient of rope_forward_head, in place: dx = R^T dy.
template <typename T>
ZERO3_HOST_DEVICE void rope_backward_head(T* dx, const T* cos, const T* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const kernel_math::RotatedPair<T> r = kernel_math::rope_rotate_back(dx[i], dx[i + half], cos[i], sin[i]);
    dx[i] = r.lo;
    dx[i + half] = r.hi;
  }
}

// Rotates n_heads heads of head_dim elements starting at column 0 of each of the table's n_tokens rows of x
// (row stride ld). Used on the q and k column blocks of the fused qkv activations.
template <typename T>
void rope_forward(T* x, int64_t ld, int64_t n_heads, int64_t head_dim, const RopeTable<T>& table);

template <typename T>
void rope_backward(T* dx, int64_t ld, int64_t n_heads, int64_t head_dim, const RopeTable<T>& table);

}  // namespace llama3

// Rotary embeddings and the SwiGLU activation on the device (cuda_ops.hpp; the formulas of ops/rope.hpp and
// ops/swiglu.hpp). Both are element kernels in grid-stride loops: RoPE takes one (token, head, i < half) pair
// per iteration and rotates elements i and i + half of that head in place; SwiGLU one (row, i < inter) element.
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"

namespace llama3::cuda {
namespace {

using namespace kernels;

// Forward: out_i = a cos - b sin, out_{i+half} = b cos + a sin (a = x_i, b = x_{i+half}); backward: the transposed
// rotation.
template <typename T, bool kBackward>
__global__ void rope_kernel(T* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                            const float* sin) {
  const int64_t half = head_dim / 2, per_token = n_heads * half, total = n_tokens * per_token;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t r = idx / per_token, rem = idx - r * per_token;
    const int64_t h = rem / half, i = rem - h * half;
    T* xh = x + r * ld + h * head_dim;
    const float c = cos[r * half + i], s = sin[r * half + i];
    const float a = load(xh, i), b = load(xh, i + half);
    if (kBackward) {
      store(xh, i, a * c + b * s);
      store(xh, i + half, b * c - a * s);
    } else {
      store(xh, i, a * c - b * s);
      store(xh, i + half, b * c + a * s);
    }
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* gu, T* out, int64_t rows, int64_t inter) {
  const int64_t total = rows * inter;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t r = idx / inter, i = idx - r * inter;
    const float g = load(gu, r * 2 * inter + i), u = load(gu, r * 2 * inter + inter + i);
    store(out, idx, g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* gu, const T* dout, T* dgu, int64_t rows, int64_t inter) {
  const int64_t total = rows * inter;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t r = idx / inter, i = idx - r * inter;
    const float g = load(gu, r * 2 * inter + i), u = load(gu, r * 2 * inter + inter + i);
    const float dh = load(dout, idx);
    const float s = 1.0f / (1.0f + expf(-g));
    store(dgu, r * 2 * inter + i, dh * u * (s * (1.0f + g * (1.0f - s))));
    store(dgu, r * 2 * inter + inter + i, dh * (g * s));
  }
}

void check_rope(const char* op, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, DType act) {
  detail::check_act(act, op);
  detail::check_non_negative(n_tokens, op, "n_tokens");
  detail::check_non_negative(n_heads, op, "n_heads");
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw zero3::InvalidArgument(std::string(op) + ": head_dim = " + std::to_string(head_dim) +
                                 " must be even and > 0");
  }
  if (ld < n_heads * head_dim) {
    throw zero3::InvalidArgument(std::string(op) + ": row stride " + std::to_string(ld) +
                                 " < n_heads * head_dim = " + std::to_string(n_heads * head_dim));
  }
}

template <bool kBackward>
void rope(const char* op, void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
          const float* sin, DType act, cudaStream_t stream) {
  check_rope(op, ld, n_tokens, n_heads, head_dim, act);
  const int64_t pairs = n_tokens * n_heads * (head_dim / 2);
  if (pairs == 0) return;
  dispatch_act(act, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rope_kernel<T, kBackward><<<element_blocks(pairs), kElementThreads, 0, stream>>>(static_cast<T*>(x), ld, n_tokens,
                                                                                     n_heads, head_dim, cos, sin);
    LLAMA3_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace

void rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                  const float* sin, DType act, cudaStream_t stream) {
  rope<false>("rope_forward", x, ld, n_tokens, n_heads, head_dim, cos, sin, act, stream);
}

void rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin, DType act, cudaStream_t stream) {
  rope<true>("rope_backward", dx, ld, n_tokens, n_heads, head_dim, cos, sin, act, stream);
}

void swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter, DType act, cudaStream_t stream) {
  detail::check_non_negative(rows, "swiglu_forward", "rows");
  detail::check_non_negative(inter, "swiglu_forward", "inter");
  detail::check_act(act, "swiglu_forward");
  if (rows * inter == 0) return;
  dispatch_act(act, "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_forward_kernel<T><<<element_blocks(rows * inter), kElementThreads, 0, stream>>>(
        static_cast<const T*>(gu), static_cast<T*>(out), rows, inter);
    LLAMA3_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
  });
}

void swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter, DType act,
                     cudaStream_t stream) {
  detail::check_non_negative(rows, "swiglu_backward", "rows");
  detail::check_non_negative(inter, "swiglu_backward", "inter");
  detail::check_act(act, "swiglu_backward");
  if (rows * inter == 0) return;
  dispatch_act(act, "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_backward_kernel<T><<<element_blocks(rows * inter), kElementThreads, 0, stream>>>(
        static_cast<const T*>(gu), static_cast<const T*>(dout), static_cast<T*>(dgu), rows, inter);
    LLAMA3_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
  });
}

}  // namespace llama3::cuda

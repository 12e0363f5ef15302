// Rotary embeddings and the SwiGLU activation on the device (cuda_ops.hpp; the arithmetic and the index of each
// item: kernel_math/rope_math.hpp and kernel_math/swiglu_math.hpp, as the CPU ops). Both are element kernels in
// grid-stride loops: RoPE takes V (token, head, i < half) pairs per iteration and rotates elements i and i + half of
// that head in place; SwiGLU V (row, i < inter) elements. V is the 16-byte pack (4 f32, 8 bf16) when the shape and the
// pointers allow it (kernel_support.cuh), else 1; each element's arithmetic is the same either way.
#include <initializer_list>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"
#include "kernel_math/rope_math.hpp"
#include "kernel_math/swiglu_math.hpp"

namespace llama3::cuda {
namespace {

using namespace kernels;
using namespace kernel_math;

// Forward: out_i = a cos - b sin, out_{i+half} = b cos + a sin (a = x_i, b = x_{i+half}); backward: the transposed
// rotation. One iteration takes V consecutive i of one (token, head): V = kPack<T> (16-byte loads of x, and of the
// f32 cos and sin) when half, the row stride and the pointers allow, else 1.
template <typename T, int V, bool kBackward>
__global__ void rope_kernel(T* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                            const float* sin) {
  const int64_t half = head_dim / 2;
  const RopeItems items = rope_items(n_tokens, n_heads, half, V);
  for (int64_t idx = global_thread(); idx < items.total; idx += grid_threads()) {
    const RopeItem item = rope_item(items, idx);
    const int64_t r = item.token, i = item.i;
    T* xh = x + r * ld + item.head * head_dim;
    float a[V], b[V], c[V], s[V];
    load_pack<T, V>(xh + i, a);
    load_pack<T, V>(xh + i + half, b);
    load_pack<float, V>(cos + r * half + i, c);
    load_pack<float, V>(sin + r * half + i, s);
    float lo[V], hi[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const RotatedPair<float> p =
          kBackward ? rope_rotate_back(a[k], b[k], c[k], s[k]) : rope_rotate(a[k], b[k], c[k], s[k]);
      lo[k] = p.lo;
      hi[k] = p.hi;
    }
    store_pack<T, V>(xh + i, lo);
    store_pack<T, V>(xh + i + half, hi);
  }
}

// One iteration takes V consecutive elements i of one row: gate at gu[r, i], up at gu[r, inter + i].
template <typename T, int V>
__global__ void swiglu_forward_kernel(const T* gu, T* out, int64_t rows, int64_t inter) {
  const int64_t total = rows * (inter / V);
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const SwigluItem item = swiglu_item(idx, inter, V);
    const int64_t r = item.row, i = item.i;
    float g[V], u[V], o[V];
    load_pack<T, V>(gu + r * 2 * inter + i, g);
    load_pack<T, V>(gu + r * 2 * inter + inter + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = swiglu_forward_elem(g[k], u[k]);
    store_pack<T, V>(out + r * inter + i, o);
  }
}

template <typename T, int V>
__global__ void swiglu_backward_kernel(const T* gu, const T* dout, T* dgu, int64_t rows, int64_t inter) {
  const int64_t total = rows * (inter / V);
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const SwigluItem item = swiglu_item(idx, inter, V);
    const int64_t r = item.row, i = item.i;
    float g[V], u[V], dh[V], dg[V], du[V];
    load_pack<T, V>(gu + r * 2 * inter + i, g);
    load_pack<T, V>(gu + r * 2 * inter + inter + i, u);
    load_pack<T, V>(dout + r * inter + i, dh);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const SwigluGrad<float> d = swiglu_backward_elem(g[k], u[k], dh[k]);
      dg[k] = d.dg;
      du[k] = d.du;
    }
    store_pack<T, V>(dgu + r * 2 * inter + i, dg);
    store_pack<T, V>(dgu + r * 2 * inter + inter + i, du);
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
  const int64_t half = head_dim / 2, pairs = n_tokens * n_heads * half;
  if (pairs == 0) return;
  dispatch_act(act, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // kPack<T> >= 4 f32 of cos and sin, so half % kPack<T> == 0 keeps their rows 16-byte aligned too.
    const bool vector = half % kPack<T> == 0 && ld % kPack<T> == 0 && aligned16({x, cos, sin});
    dispatch_width<T>(vector, [&](auto width) {
      constexpr int V = decltype(width)::value;
      rope_kernel<T, V, kBackward><<<element_blocks(pairs / V), kElementThreads, 0, stream>>>(
          static_cast<T*>(x), ld, n_tokens, n_heads, head_dim, cos, sin);
      LLAMA3_CUDA_CHECK_LAUNCH(op);
    });
  });
}

// Rows of 2 * inter (gate | up) and inter: 16-byte packs when inter is a multiple of the pack and the pointers
// are aligned.
template <typename T>
bool vector_swiglu(int64_t inter, std::initializer_list<const void*> pointers) {
  return inter % kPack<T> == 0 && aligned16(pointers);
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
    dispatch_width<T>(vector_swiglu<T>(inter, {gu, out}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      swiglu_forward_kernel<T, V><<<element_blocks(rows * inter / V), kElementThreads, 0, stream>>>(
          static_cast<const T*>(gu), static_cast<T*>(out), rows, inter);
      LLAMA3_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
    });
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
    dispatch_width<T>(vector_swiglu<T>(inter, {gu, dout, dgu}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      swiglu_backward_kernel<T, V><<<element_blocks(rows * inter / V), kElementThreads, 0, stream>>>(
          static_cast<const T*>(gu), static_cast<const T*>(dout), static_cast<T*>(dgu), rows, inter);
      LLAMA3_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
    });
  });
}

}  // namespace llama3::cuda

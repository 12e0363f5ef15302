// The SwiGLU activation of the Llama MLP, h = silu(g) * u with silu(g) = g * sigmoid(g), where g = gate_proj(x)
// and u = up_proj(x); the MLP is down_proj(h).
//
// The gate and up projections are adjacent in a layer's flat parameters, so one GEMM produces both: each row
// of `gu` is [g (inter) | u (inter)]. Backward writes dg and du into the same fused layout:
//   dg = dh * u * s * (1 + g * (1 - s)),  du = dh * silu(g),  s = sigmoid(g)
// (kernel_math/swiglu_math.hpp, which the CUDA kernels run too).
#pragma once

#include <cstdint>

namespace llama3 {

// gu (rows, 2*inter) -> h (rows, inter).
template <typename T>
void swiglu_forward(const T* gu, T* h, int64_t rows, int64_t inter);

// dh (rows, inter) -> dgu (rows, 2*inter), overwritten.
template <typename T>
void swiglu_backward(const T* gu, const T* dh, T* dgu, int64_t rows, int64_t inter);

}  // namespace llama3

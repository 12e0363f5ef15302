// A bias-free linear layer as Hugging Face's nn.Linear stores it: W is (out, in), row-major, and
//
//   y (n, out) = x (n, in) W^T
//
// Backward: dx (n, in) = dy W (overwritten, or added when accumulate_dx), dW (out, in) += dy^T x.
// Both go through gemm(). x, dy and dx may have row strides larger than their width (a column block of a fused
// buffer, e.g. the q part of (n, q+k+v)); W and dW are always packed.
#pragma once

#include <cstdint>

namespace llama3 {

template <typename T>
void linear_forward(const T* x, int64_t ldx, const T* w, T* y, int64_t ldy, int64_t n, int64_t in, int64_t out);

// dx == nullptr skips the input gradient; dw == nullptr skips the weight gradient.
template <typename T>
void linear_backward(const T* x, int64_t ldx, const T* w, const T* dy, int64_t lddy, T* dx, int64_t lddx, T* dw,
                     int64_t n, int64_t in, int64_t out, bool accumulate_dx);

}  // namespace llama3

// Token embedding: x[i, :] = table[ids[i], :], table (vocab, hidden).
//
// Backward adds dx[i, :] into row ids[i] of dtable. A token id outside [0, vocab) is a
// zero3::InvalidArgument naming its position and value; nothing is written in that case.
#pragma once

#include <cstdint>

#include "zero3/host_device.hpp"

namespace llama3 {

// One element: the CUDA backend launches it per (token, column); the CPU driver loops over it.
template <typename T>
ZERO3_HOST_DEVICE void embedding_forward_elem(const int32_t* ids, const T* table, T* x, int64_t hidden, int64_t i,
                                              int64_t j) {
  x[i * hidden + j] = table[static_cast<int64_t>(ids[i]) * hidden + j];
}

template <typename T>
void embedding_forward(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t hidden, T* x);

// dtable += scatter(dx). Repeated ids add up in token order, so the result does not depend on threads.
template <typename T>
void embedding_backward(const int32_t* ids, int64_t n, const T* dx, int64_t vocab, int64_t hidden, T* dtable);

// Throws zero3::InvalidArgument when some id is outside [0, vocab).
void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what);

}  // namespace llama3

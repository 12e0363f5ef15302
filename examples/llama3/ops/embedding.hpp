// Token embedding: x[i, :] = table[ids[i], :], table (vocab, hidden).
//
// Backward adds dx[i, :] into row ids[i] of dtable, the tokens of an id in token order (kernel_math/embedding_math.hpp,
// which the CUDA kernels run too). A token id outside [0, vocab) is a zero3::InvalidArgument naming its position and
// value; nothing is written in that case.
#pragma once

#include <cstdint>

namespace llama3 {

template <typename T>
void embedding_forward(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t hidden, T* x);

// dtable += scatter(dx). Repeated ids add up in token order, so the result does not depend on threads.
template <typename T>
void embedding_backward(const int32_t* ids, int64_t n, const T* dx, int64_t vocab, int64_t hidden, T* dtable);

// Throws zero3::InvalidArgument when some id is outside [0, vocab).
void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what);

}  // namespace llama3

#include "ops/embedding.hpp"

#include <string>

#include "kernel_math/embedding_math.hpp"
#include "ops/parallel.hpp"
#include "zero3/error.hpp"

namespace llama3 {

void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw zero3::InvalidArgument(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                   " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
}

template <typename T>
void embedding_forward(const int32_t* ids, int64_t n, const T* table, int64_t vocab, int64_t hidden, T* x) {
  check_token_ids(ids, n, vocab, "input_ids");
#pragma omp parallel for schedule(static) if (n * hidden >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < hidden; ++j) x[i * hidden + j] = table[kernel_math::embedding_source(ids, i, j, hidden)];
}

template <typename T>
void embedding_backward(const int32_t* ids, int64_t n, const T* dx, int64_t vocab, int64_t hidden, T* dtable) {
  check_token_ids(ids, n, vocab, "input_ids");
  // Threads split the columns, never the tokens: two tokens with the same id never race.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * hidden >= kParallelMinWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < hidden ? j0 + kBlock : hidden;
    for (int64_t i = 0; i < n; ++i) {
      T* drow = dtable + static_cast<int64_t>(ids[i]) * hidden;
      const T* xrow = dx + i * hidden;
      for (int64_t j = j0; j < j1; ++j) drow[j] += xrow[j];
    }
  }
}

template void embedding_forward<float>(const int32_t*, int64_t, const float*, int64_t, int64_t, float*);
template void embedding_forward<double>(const int32_t*, int64_t, const double*, int64_t, int64_t, double*);
template void embedding_backward<float>(const int32_t*, int64_t, const float*, int64_t, int64_t, float*);
template void embedding_backward<double>(const int32_t*, int64_t, const double*, int64_t, int64_t, double*);

}  // namespace llama3

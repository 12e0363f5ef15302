#include "ops/rmsnorm.hpp"

#include "ops/parallel.hpp"

namespace llama3 {

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t n, T eps) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    T s = rmsnorm_forward_row(x + r * n, w, y + r * n, n, eps);
    if (rstd != nullptr) rstd[r] = s;
  }
}

template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t n,
                      bool accumulate_dx) {
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    rmsnorm_backward_row(x + r * n, w, dy + r * n, rstd[r], dx + r * n, n, accumulate_dx);
  if (dw == nullptr) return;
  // Threads own blocks of columns and sum the rows in order: the same bits for any thread count.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < n ? j0 + kBlock : n;
    T acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j)
        acc[j - j0] += kernel_math::rmsnorm_weight_grad_term(x[r * n + j], dy[r * n + j], rstd[r]);
    for (int64_t j = j0; j < j1; ++j) dw[j] += acc[j - j0];
  }
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t, float);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t, int64_t, double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*, float*, float*, int64_t,
                                      int64_t, bool);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*, double*, double*,
                                       int64_t, int64_t, bool);

}  // namespace llama3

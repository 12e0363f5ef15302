#include "ops/gemm.hpp"

#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/parallel.hpp"
#include "zero3/build_config.hpp"
#include "zero3/error.hpp"

#if ZERO3_HAVE_BLAS
#include <cblas.h>
#endif

namespace llama3 {
namespace {

void check_dims(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  for (int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) {
      throw zero3::InvalidArgument("gemm: dimension or stride " + std::to_string(v) + " outside [0, INT_MAX] (m=" +
                                   std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ")");
    }
  }
}

}  // namespace

template <typename T>
void gemm_loop(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  check_dims(m, n, k, lda, ldb, ldc);
#pragma omp parallel if (m * n * k >= kParallelMinWork)
  {
    std::vector<T> acc(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) acc[j] = T(0);
      if (!trans_b) {
        // Row i of C is a combination of rows of B: the inner loop runs along contiguous memory.
        for (int64_t p = 0; p < k; ++p) {
          T aip = trans_a ? a[p * lda + i] : a[i * lda + p];
          const T* brow = b + p * ldb;
          for (int64_t j = 0; j < n; ++j) acc[j] += aip * brow[j];
        }
      } else {
        for (int64_t j = 0; j < n; ++j) {
          const T* brow = b + j * ldb;
          T s = T(0);
          if (!trans_a) {
            const T* arow = a + i * lda;
            for (int64_t p = 0; p < k; ++p) s += arow[p] * brow[p];
          } else {
            for (int64_t p = 0; p < k; ++p) s += a[p * lda + i] * brow[p];
          }
          acc[j] = s;
        }
      }
      T* crow = c + i * ldc;
      if (beta == T(0)) {
        for (int64_t j = 0; j < n; ++j) crow[j] = alpha * acc[j];
      } else {
        for (int64_t j = 0; j < n; ++j) crow[j] = alpha * acc[j] + beta * crow[j];
      }
    }
  }
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
#if ZERO3_HAVE_BLAS
  check_dims(m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS scales C by beta here too, but some builds read C even when beta is 0; keep the contract exact.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  // BLAS wants the leading dimension of each stored matrix to be at least its row length.
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }
#else
  gemm_loop(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

bool gemm_uses_blas() { return ZERO3_HAVE_BLAS != 0; }

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);
template void gemm_loop<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                               int64_t, float, float*, int64_t);
template void gemm_loop<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                                int64_t, double, double*, int64_t);

}  // namespace llama3

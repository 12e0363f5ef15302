#include "ops/gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <mutex>
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

#if ZERO3_HAVE_BLAS
namespace {

// One threading runtime, not two: OpenBLAS's own (pthreads) workers and OpenMP's spin-waiting workers on the
// same cores slowed a tiny-model step about 60x on 2 cores. So OpenBLAS runs single-threaded and gemm splits
// C into row (or column) blocks over OpenMP threads, each block one cblas call.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

template <typename T>
void blas_call(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }
}

}  // namespace
#endif

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
#if ZERO3_HAVE_BLAS
  check_dims(m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // Some BLAS builds read C even when beta is 0; keep the contract exact.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  single_threaded_blas();
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads <= 1 || m * n * k < 8 * kParallelMinWork) {
    blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the longer side of C into one block per thread (a multiple of 16 wide, so kernels stay aligned).
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  int64_t block = (extent + threads - 1) / threads;
  block = (block + 15) / 16 * 16;
  const int64_t blocks = (extent + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * block, len = std::min(block, extent - lo);
    if (by_rows) {
      const T* ab = trans_a ? a + lo : a + lo * lda;
      blas_call(trans_a, trans_b, len, n, k, alpha, ab, lda, b, ldb, beta, c + lo * ldc, ldc);
    } else {
      const T* bb = trans_b ? b + lo * ldb : b + lo;
      blas_call(trans_a, trans_b, m, len, k, alpha, a, lda, bb, ldb, beta, c + lo, ldc);
    }
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

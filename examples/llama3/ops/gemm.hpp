// The one GEMM every linear layer and the attention go through. Row-major, like the tensors of the model:
//
//   C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C,   op(X) = X, or X^T when trans_X
//
// lda, ldb, ldc are row strides in elements of A, B, C as stored (A stored (m, k), or (k, m) when trans_a).
// With OpenBLAS (ZERO3_HAVE_BLAS) this is cblas_sgemm / cblas_dgemm; otherwise gemm_loop. beta == 0 ignores
// what C held (NaN included). Blocking. Threads: OpenMP's only. The first call sets OpenBLAS to one thread
// for the whole process (openblas_set_num_threads(1)) and large products are split into blocks of C over
// OpenMP threads, because OpenBLAS's own workers and OpenMP's spin-waiting ones fight over the same cores.
// Called inside an OpenMP parallel region, it runs on the calling thread.
#pragma once

#include <cstdint>

namespace llama3 {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

// The portable fallback (OpenMP loops over rows of C), also the reference the BLAS path is tested against.
template <typename T>
void gemm_loop(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// True when gemm calls OpenBLAS.
bool gemm_uses_blas();

}  // namespace llama3

// Blas (cuda_ops.hpp): row-major GEMMs on cuBLAS, which is column-major.
//
// A row-major (r, c) matrix with row stride ld is, read column-major, its transpose (c, r) with leading dimension
// ld. So the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first and A
// second, m and n swapped, each with its own transpose flag unchanged (op(X)^T is X read column-major when X is
// not transposed, i.e. CUBLAS_OP_N, and the transpose of that when it is).
//
// Math: CUBLAS_COMPUTE_32F always. f32 inputs run in CUBLAS_PEDANTIC_MATH (no TF32, not even under
// NVIDIA_TF32_OVERRIDE), so f32 results differ from the CPU only by the order of the sums; bf16 inputs run in
// the default math mode (tensor cores) with reduced-precision split-K reductions disallowed, so every partial
// sum is f32. The handle is bound to the stream for its life.
#include <cublas_v2.h>

#include <climits>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "zero3/error.hpp"

namespace llama3::cuda {
namespace {

cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }

std::string status_text(cublasStatus_t s) {
  return std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s);
}

void check_cublas(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw zero3::CudaError(what + " failed: " + status_text(s));
}

cudaDataType_t cuda_type(DType t) { return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

// cuBLAS's workspace: what NVIDIA recommends for Hopper (32 MiB; 4 MiB suffice on earlier GPUs).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// cuBLAS wants every leading dimension >= 1, even for a matrix it does not read (k == 0 leaves A and B unread,
// and check_shape lets their row stride be 0 then).
int cublas_ld(int64_t ld) { return static_cast<int>(ld < 1 ? 1 : ld); }

struct GemmShape {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc, count;
  DType ab_type, c_type;

  std::string describe(const char* call) const {
    return std::string(call) + "(row-major C(" + std::to_string(m) + "x" + std::to_string(n) + ") = op" +
           (trans_a ? "T" : "N") + "(A) op" + (trans_b ? "T" : "N") + "(B), k " + std::to_string(k) + ", lda " +
           std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) +
           (count != 1 ? ", batch " + std::to_string(count) : std::string()) + ", " +
           std::string(zero3::dtype_name(ab_type)) + " -> " + std::string(zero3::dtype_name(c_type)) + ")";
  }
};

void check_shape(const GemmShape& g, const char* call) {
  auto bad = [&](const std::string& why) { throw zero3::InvalidArgument(g.describe(call) + ": " + why); };
  if (g.ab_type != DType::f32 && g.ab_type != DType::bf16) bad("A and B must be f32 or bf16");
  if (g.c_type != g.ab_type && g.c_type != DType::f32) bad("C must have the type of A and B, or be f32");
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.count}) {
    if (v < 0 || v > INT_MAX) bad("sizes, strides and the batch must be in [0, 2^31 - 1]");
  }
  // Row strides cover the stored rows (a stored matrix with zero columns has no constraint).
  const int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
  if (g.lda < a_cols || g.ldb < b_cols || g.ldc < g.n) bad("a row stride is smaller than its matrix's width");
}

// f32: no TF32. bf16: tensor cores, and split-K partial sums kept in f32 even when C is bf16 (cuBLAS may
// otherwise reduce them in the output type, which PyTorch allows by default).
void set_math_mode(cublasHandle_t h, DType ab_type) {
  const cublasMath_t mode =
      ab_type == DType::f32
          ? CUBLAS_PEDANTIC_MATH
          : static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  check_cublas(cublasSetMathMode(h, mode), "cublasSetMathMode");
}

}  // namespace

Blas::Blas(zero3::Device& device) : device_(device), stream_(static_cast<cudaStream_t>(device.default_stream())) {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  // cuBLAS's own workspace comes from the device's pool too (else cuBLAS cudaMallocs one of its own).
  workspace_ = device.allocate(kWorkspaceBytes);
  cublasStatus_t s = cublasSetStream(h, stream_);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(h, workspace_, kWorkspaceBytes);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    handle_ = nullptr;
    device.deallocate(workspace_, kWorkspaceBytes);
    check_cublas(s, "cublasSetStream / cublasSetWorkspace");
  }
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(as_handle(handle_));
  device_.deallocate_after(workspace_, kWorkspaceBytes, device_.default_stream());
}

void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                const void* b, int64_t ldb, float beta, void* c, int64_t ldc, DType ab_type, DType c_type) {
  const GemmShape g{trans_a, trans_b, m, n, k, lda, ldb, ldc, 1, ab_type, c_type};
  check_shape(g, "cublasGemmEx");
  if (m == 0 || n == 0) return;
  cublasHandle_t h = as_handle(handle_);
  set_math_mode(h, ab_type);
  check_cublas(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                            cuda_type(ab_type), cublas_ld(ldb), a, cuda_type(ab_type), cublas_ld(lda), &beta, c,
                            cuda_type(c_type), cublas_ld(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               g.describe("cublasGemmEx"));
}

void Blas::gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                                int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, float beta,
                                void* c, int64_t ldc, int64_t stride_c, int64_t count, DType ab_type, DType c_type) {
  const GemmShape g{trans_a, trans_b, m, n, k, lda, ldb, ldc, count, ab_type, c_type};
  check_shape(g, "cublasGemmStridedBatchedEx");
  if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
    throw zero3::InvalidArgument(g.describe("cublasGemmStridedBatchedEx") + ": batch strides must be >= 0");
  }
  if (m == 0 || n == 0 || count == 0) return;
  cublasHandle_t h = as_handle(handle_);
  set_math_mode(h, ab_type);
  check_cublas(cublasGemmStridedBatchedEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                          cuda_type(ab_type), cublas_ld(ldb), static_cast<long long>(stride_b), a,
                                          cuda_type(ab_type), cublas_ld(lda), static_cast<long long>(stride_a), &beta,
                                          c, cuda_type(c_type), cublas_ld(ldc), static_cast<long long>(stride_c),
                                          static_cast<int>(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               g.describe("cublasGemmStridedBatchedEx"));
}

}  // namespace llama3::cuda

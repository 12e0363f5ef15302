// The Llama-3 ops on a CUDA device: the same operations as ops/*.hpp (same formulas, same layouts: row-major,
// one row per token), on device memory, queued on a stream.
//
// Element types. Activations and weights are `act` = f32 or bf16 (zero3::DType::f32 / DType::bf16); weight
// gradients are always f32 (accumulated, +=); per-row statistics (rstd, log-sum-exp) are f32. Every kernel
// loads its operands into float, computes in float (reductions in float over a block, in a fixed order, so a
// run repeats its bits) and rounds once when it stores (round-to-nearest-even to bf16). With act = f32 the
// results are those of the CPU ops up to the order of the float sums (tests/gpu compare within a few ulp).
//
// Every function queues work on `stream` and returns at once; it throws zero3::CudaError when CUDA refuses a
// launch and zero3::InvalidArgument for an unsupported dtype or shape (named). Pointers are device memory of
// the current device unless said otherwise. n == 0 (no rows) queues nothing.
//
// Memory: the ops that need scratch (cuBLAS's workspace, attention's scores, the loss's logits, RMSNorm's partial
// sums) take it from a zero3 Device (its stream-ordered pool: one pool for the engine and the model) and run on
// that device's compute stream, Device::default_stream().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/lm_head_plan.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"

namespace llama3::cuda {

using zero3::DType;

// ---- GEMM: cuBLAS behind the row-major convention of ops/gemm.hpp. ----
//
//   C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C,   op(X) = X, or X^T when trans_X
//
// lda, ldb, ldc: row strides in elements of A, B, C as stored. A and B share one type (f32 or bf16); C is
// that type or f32 (weight gradients: bf16 inputs, f32 accumulator). Accumulation is f32 always
// (CUBLAS_COMPUTE_32F; with f32 inputs the pedantic mode, no TF32, so f32 runs compare with the CPU).
// Runs on `device`'s compute stream, with a cuBLAS workspace from its pool; the device must outlive it.
class Blas {
 public:
  explicit Blas(zero3::Device& device);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Where the ops on this Blas take their scratch memory (and whose compute stream stream() is).
  zero3::Device& device() const { return device_; }

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
            const void* b, int64_t ldb, float beta, void* c, int64_t ldc, DType ab_type, DType c_type);

  // `count` independent products with the same shape; operand i at a + i*stride_a (elements), etc.
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                            int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, float beta,
                            void* c, int64_t ldc, int64_t stride_c, int64_t count, DType ab_type, DType c_type);

 private:
  zero3::Device& device_;
  cudaStream_t stream_;
  void* handle_ = nullptr;  // cublasHandle_t
  void* workspace_ = nullptr;
};

// ---- Embedding. ----

// x (tokens, hidden) = table[ids] (ids on the device; every id must be in [0, vocab): the caller checks them
// on the host, where they come from).
void embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, void* x, DType act,
                       cudaStream_t stream);

// The rows of the table that a batch touches, grouped so the backward is deterministic without atomics:
// rows[u] is the u-th distinct id in increasing order and its tokens are token_ids[offsets[u] .. offsets[u+1])
// in increasing order. Built on the host from the host ids (EmbeddingGrouping::build), then uploaded.
struct EmbeddingGrouping {
  std::vector<int32_t> rows;       // distinct ids
  std::vector<int32_t> offsets;    // rows.size() + 1
  std::vector<int32_t> token_ids;  // tokens, grouped by id
  static EmbeddingGrouping build(const int32_t* host_ids, int64_t tokens);
};

// dtable[rows[u]] += sum of dx over the tokens of row u (in token order). rows, offsets, token_ids: the
// grouping's arrays in device memory; n_rows = rows.size(). dtable is f32 (vocab, hidden).
void embedding_backward(const int32_t* rows, const int32_t* offsets, const int32_t* token_ids, int64_t n_rows,
                        const void* dx, int64_t hidden, float* dtable, DType act, cudaStream_t stream);

// ---- RMSNorm (ops/rmsnorm.hpp): one block per row; 16-byte loads and stores when n is a multiple of 16 bytes
// of elements (4 f32, 8 bf16) and every pointer is 16-byte aligned, element by element otherwise. ----

// y (rows, n) = w * (x * rstd); rstd (rows, f32) may be null. y may alias x. x, w, y: act.
void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n, float eps, DType act,
                     cudaStream_t stream);

// The residual add fused with the norm that follows it: h = a + b (rounded to act, stored), y = w * (h * rstd) of
// the rounded h: the bits of add(a, b, h) then rmsnorm_forward(h, ...), in one pass over the rows. h may alias a or
// b; y must not alias h.
void add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t n, float eps, DType act, cudaStream_t stream);

// dx = residual + the input gradient (residual null: dx = the input gradient; residual == dx: accumulated), the
// residual branch's gradient added in the same pass instead of a copy before it; dw (n, f32) += the weight gradient
// (null skips it). dw is summed over rows in a fixed order (a partial sum per block of rows, then the partials in
// order; the partials are a stream-ordered allocation of a few floats per 128 rows and column from `device`'s pool).
// dx must not alias x or dy (the weight gradient reads them after dx is written). Runs on device.default_stream().
void rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy, const void* residual, void* dx,
                      float* dw, int64_t rows, int64_t n, DType act, zero3::Device& device);

// ---- Rotary embeddings (ops/rope.hpp): cos and sin tables (n_tokens, half) in f32, in device memory. ----

// Rotates n_heads heads of head_dim elements from column 0 of each row of x (row stride ld), in place.
void rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                  const float* sin, DType act, cudaStream_t stream);
void rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin, DType act, cudaStream_t stream);

// ---- SwiGLU (ops/swiglu.hpp): gu (rows, 2*inter) holds gate | up; act (rows, inter) = silu(gate) * up. ----

void swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter, DType act, cudaStream_t stream);
// dgu (rows, 2*inter) = gradient w.r.t. gate | up (overwritten).
void swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter, DType act,
                     cudaStream_t stream);

// ---- Element-wise. ----

// y = a + b (rows*n elements; y may alias a or b).
void add(const void* a, const void* b, void* y, int64_t n, DType act, cudaStream_t stream);
// dst = src converted (f32 <-> bf16, or a plain copy).
void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n, cudaStream_t stream);

// ---- Attention (ops/attention.hpp), grouped-query and causal. ----
//
// Plan: per sequence and query head, S = Q K^T / sqrt(head_dim) through Blas (batched over heads, the kv
// head of query head h being h / (n_heads / n_kv_heads)), a causal softmax kernel over each row of S that
// also writes the row's log-sum-exp, then O = P V; backward recomputes P from the log-sum-exp. S and P live
// in a device workspace (f32 scores whatever act is; attention.cu says what else), reused by every call, grown
// on demand from the Blas device's pool on the Blas stream; heads are processed in chunks of kv heads so that the
// scores and their copies stay within workspace_cap bytes (1 GiB by default; one kv head's at least, whatever
// the cap). All work runs on the Blas stream.

struct AttentionDims {
  int64_t batch = 0, seq = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
};

inline constexpr int64_t kDefaultAttentionWorkspaceCap = int64_t{1} << 30;

class Attention {
 public:
  // workspace_cap > 0 (InvalidArgument otherwise).
  explicit Attention(Blas& blas, int64_t workspace_cap = kDefaultAttentionWorkspaceCap);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // q (tokens, ldq), k (tokens, ldk), v (tokens, ldv): column blocks of the fused projection; out (tokens, ldo);
  // lse (batch, n_heads, seq) f32.
  void forward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
               int64_t ldv, void* out, int64_t ldo, float* lse, DType act);

  // dq, dk, dv overwritten (dk, dv summed over the query heads of their group); they may be column blocks of
  // one buffer.
  void backward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
                int64_t ldv, const void* out, int64_t ldo, const float* lse, const void* dout, int64_t lddo, void* dq,
                int64_t lddq, void* dk, int64_t lddk, void* dv, int64_t lddv, DType act);

  // Device bytes the workspace holds now.
  int64_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Cross-entropy fused with the LM head, chunked over rows (ops/cross_entropy.hpp). ----
//
// x (n, hidden): the normalised final states (act); w (vocab, hidden): lm_head (act); targets (n) on the
// device (kIgnoreIndex skips a row). For each chunk of rows: logits = x w^T in f32, one block per row turns
// the row into its loss and, when dx is not null, grad_scale * (softmax - onehot) (rounded to act); then
// dx (overwritten, act) and dw (f32, +=) through Blas. row_loss (n, f32, device; null skips it) receives
// each row's loss (0 for an ignored row); the caller sums it (in order, on the host or with sum_rows/add_rows)
// so the result is deterministic. Targets must be in [0, vocab) or kIgnoreIndex (count_targets checks them on
// the host); any other value gives that row a NaN loss and a zero gradient.
//
// Chunks: chunk_rows > 0 forces that many rows; <= 0 takes plan_lm_head_chunks (backend/lm_head_plan.hpp): the
// largest chunks whose workspace fits workspace_cap, so dW (read and written whole by each chunk's GEMM) is
// passed over ceil(n / rows that fit) times per call, and the logits of more rows than fit never exist. The
// workspace (the plan's workspace_bytes: f32 logits, plus their act copy with bf16) is on the Blas stream like
// all the work.
class LmHeadLoss {
 public:
  // workspace_cap > 0 (InvalidArgument otherwise).
  explicit LmHeadLoss(Blas& blas, int64_t workspace_cap = kDefaultLmHeadWorkspaceCap);
  ~LmHeadLoss();
  LmHeadLoss(const LmHeadLoss&) = delete;
  LmHeadLoss& operator=(const LmHeadLoss&) = delete;

  void run(const void* x, const void* w, const int32_t* targets, int64_t n, int64_t hidden, int64_t vocab,
           float grad_scale, void* dx, float* dw, float* row_loss, int64_t chunk_rows, DType act);

  int64_t workspace_bytes() const;
  // Bytes the dW GEMMs have read and written through the weight gradient since construction (8 * vocab *
  // hidden per chunk with dw): the counter the plan's weight_grad_bytes is checked against.
  int64_t weight_grad_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// out[0] (device) = the sum of values[0, n) (device) in double, in row order (((v0 + v1) + v2) + ...: the bits of
// the host loop `double s = 0; for (float v : values) s += v;`). One block, n dependent additions on one thread.
// n == 0 writes 0.
void sum_rows(const float* values, int64_t n, double* out, cudaStream_t stream);
// accumulator[0] (device) += that sum, on the stream, without a host wait: the deferred form of the host's
// `total += s` (the same bits when the host would add the same sums in the same order).
void add_rows(const float* values, int64_t n, double* accumulator, cudaStream_t stream);

}  // namespace llama3::cuda

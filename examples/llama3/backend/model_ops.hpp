// The operations one Llama-3 unit (embedding, decoder layer, head) needs, on one kind of memory: the seam
// between the model's orchestration (model_runner.hpp, written once) and the hardware that runs it.
//
// Implementations: CpuModelOps (backend/cpu_model_ops.hpp: host memory, the ops/*.hpp functions, f32
// activations, the same bits as llama_model.cpp) and CudaModelOps (cuda/cuda_model_ops.hpp, in builds with
// CUDA: device memory, cuda/cuda_ops.hpp, f32 or bf16 activations). make_model_ops picks one for a zero3
// Device.
//
// Memory. Every pointer an op takes is backend memory (allocate()) unless its name says host_. Element types:
//   activations and weights   act()  (void*: f32 on cpu; f32 or bf16 on cuda)
//   weight gradients          f32, accumulated (+=), as the engine's flat gradient buffers hold them
//   rstd, log-sum-exp         f32 (per row)
//   rope cos and sin          f32 (n_tokens, head_dim/2)
//   token ids and targets     int32
// Shapes and formulas are those of ops/*.hpp (row-major, one row per token); input gradients are
// overwritten unless an argument says accumulate.
//
// Ordering. Ops are queued in call order on the backend's one stream (cpu: run in the call; cuda: CUDA's
// legacy default stream, the stream the engine orders its gathers and reductions against). copy_to_host,
// take_loss_sum and synchronize return with their results on the host; everything else may return before the
// work is done. A backend object is used by one thread at a time.
//
// Errors: zero3::InvalidArgument for a bad shape, token id or target (named); zero3::Unsupported
// ("<backend> model ops do not support <what>") for an element type the backend lacks; zero3::CudaError
// when CUDA fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"

namespace llama3 {

class ModelOps {
 public:
  virtual ~ModelOps() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual zero3::DType act() const = 0;  // activation and weight element type
  size_t act_size() const { return zero3::dtype_size(act()); }

  // ---- Memory ----

  // `bytes` of backend memory, aligned to at least 64 bytes, contents undefined; nullptr for 0 bytes.
  virtual void* allocate(size_t bytes) = 0;
  // Returns memory from allocate() (`bytes` as allocated); queued work that still reads it finishes first.
  virtual void free(void* ptr, size_t bytes) noexcept = 0;
  virtual void zero(void* ptr, size_t bytes) = 0;
  // Backend to backend, non-overlapping.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Returns when host_src may be reused.
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  // Returns when the bytes are in host_dst (waits for the work queued before).
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  // Waits for all queued work.
  virtual void synchronize() = 0;
  // Bytes of scratch the ops hold themselves (attention scores, chunks of logits), outside allocate() (cuda: from
  // the same zero3 Device, so its counters include them).
  virtual int64_t workspace_bytes() const = 0;

  // ---- GEMM (ops/gemm.hpp's row-major convention) ----

  // C (m, n) = alpha * op(A) op(B) + beta * C. A and B are act; C is act or f32 (c_type; weight gradients).
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                    int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, zero3::DType c_type) = 0;

  // ---- Embedding (ops/embedding.hpp) ----

  // x (tokens, hidden) = table[ids]; every id in [0, vocab) (checked on the host by the caller).
  virtual void embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t vocab, int64_t hidden,
                                 void* x) = 0;
  // dtable (vocab, hidden, f32) += scatter of dx into the rows of ids, deterministic. host_ids: the same ids
  // on the host (the cuda backend groups the tokens by id there).
  virtual void embedding_backward(const int32_t* ids, const int32_t* host_ids, int64_t tokens, const void* dx,
                                  int64_t vocab, int64_t hidden, float* dtable) = 0;

  // ---- RMSNorm (ops/rmsnorm.hpp) ----

  // y (rows, n) = w * (x * rstd); rstd may be null; y may alias x.
  virtual void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n,
                               float eps) = 0;
  // The residual add and the norm after it: h = a + b (stored), y = w * (h * rstd), the bits of add(a, b, h) then
  // rmsnorm_forward(h, w, y, rstd) (cuda: one pass). h may alias a or b; y must not alias h.
  virtual void add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd,
                                   int64_t rows, int64_t n, float eps) = 0;
  // dx = residual + the input gradient (residual null: the input gradient alone; residual == dx: accumulated;
  // otherwise the bits of copying residual into dx and accumulating); dw (n, f32) += the weight gradient (null skips
  // it). dx must not alias x or dy.
  virtual void rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy, const void* residual,
                                void* dx, float* dw, int64_t rows, int64_t n) = 0;

  // ---- Rotary embeddings (ops/rope.hpp), in place on n_heads heads from column 0 of each row (stride ld) ----

  virtual void rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                            const float* sin) = 0;
  virtual void rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                             const float* cos, const float* sin) = 0;

  // ---- SwiGLU (ops/swiglu.hpp): gu (rows, 2*inter) = gate | up ----

  virtual void swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter) = 0;
  virtual void swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter) = 0;

  // ---- Element-wise ----

  // y = a + b over n act elements; y may alias a or b.
  virtual void add(const void* a, const void* b, void* y, int64_t n) = 0;
  // dst = src converted (round to nearest even into 16-bit types), n elements.
  virtual void convert(const void* src, zero3::DType src_type, void* dst, zero3::DType dst_type, int64_t n) = 0;

  // ---- Attention (ops/attention.hpp): grouped-query, causal ----

  // lse (batch, n_heads, seq) f32.
  virtual void attention_forward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                 const void* v, int64_t ldv, void* out, int64_t ldo, float* lse) = 0;
  // out: the forward's output; dq, dk, dv overwritten (column blocks of one buffer allowed).
  virtual void attention_backward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                  const void* v, int64_t ldv, const void* out, int64_t ldo, const float* lse,
                                  const void* dout, int64_t lddo, void* dq, int64_t lddq, void* dk, int64_t lddk,
                                  void* dv, int64_t lddv) = 0;

  // ---- LM head + cross-entropy (ops/cross_entropy.hpp), chunked over rows ----

  // x (n, hidden) normalised final states, w (vocab, hidden); targets (n) in backend memory and host_targets
  // the same on the host (counted and checked there). With dx: dx (n, hidden) overwritten and dw (f32) +=
  // the gradients of grad_scale * (sum of the row losses). chunk_rows > 0: rows of logits at a time; <= 0: the
  // backend's own (cpu: default_loss_chunk_rows, sized for a core's caches; cuda: plan_lm_head_chunks, as many
  // rows as 1 GiB of logits holds, backend/lm_head_plan.hpp). Returns the number of non-ignored targets
  // (counted on the host); the sum of the row losses (in double, in row order) is added to the loss accumulator.
  virtual int64_t lm_head_cross_entropy(const void* x, const void* w, const int32_t* targets,
                                        const int32_t* host_targets, int64_t n, int64_t hidden, int64_t vocab,
                                        float grad_scale, void* dx, float* dw, int64_t chunk_rows) = 0;

  // The loss accumulator: total = ((0 + s_1) + s_2) + ... in double over the row-loss sums s_i of the
  // lm_head_cross_entropy calls since the last take, in call order (the bits a host loop adding the s_i gets);
  // returns it and starts again from 0. cpu: the sums are added as each call computes them; cuda: on the device,
  // on the stream (no host wait per call), and this call reads them with one copy and one wait (none when no
  // call came since the last take).
  virtual double take_loss_sum() = 0;
};

// The backend for a zero3 device: cpu -> CpuModelOps (f32 activations whatever `compute` is: 16-bit
// parameters are widened), cuda -> CudaModelOps with act = compute (f32 or bf16; f16 is zero3::Unsupported).
// Throws zero3::Unsupported for cuda in a build without it.
std::unique_ptr<ModelOps> make_model_ops(zero3::Device& device, zero3::DType compute);

}  // namespace llama3

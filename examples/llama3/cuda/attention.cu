// Grouped-query causal attention on the device (cuda_ops.hpp Attention; the row arithmetic and the head mapping of
// kernel_math/attention_math.hpp, as the CPU op).
//
// Algorithm: the plan of the CPU op, not a fused (flash) kernel. Per sequence b and per query head, scores are
// materialised in f32:
//   forward   S = scale * Q_h K_g^T           batched GEMM (Blas, f32 out), scale = 1/sqrt(head_dim)
//             P = causal_softmax(S)           causal_softmax_kernel: one block per row, in place; writes the
//                                             row's log-sum-exp to lse (b, h, t)
//             O_h = P V_g                     batched GEMM
//   backward  S = scale * Q_h K_g^T, dP = dO_h V_g^T                 batched GEMMs (f32 out)
//             P = exp(S - lse), dS = P * (dP - rowsum(P * dP))       causal_softmax_backward_kernel
//             dV_g (+)= P^T dO_h, dQ_h = scale dS K_g, dK_g (+)= scale dS^T Q_h   batched GEMMs
// g = h / group, group = n_heads / n_kv_heads. A batched GEMM covers the kv heads g0 .. g0+c-1 of one sequence
// together with one index j < group inside every group (query heads g*group + j; attention_head_batches): in the
// token-row layout those operands sit at constant column strides (group*head_dim for query heads, head_dim for kv
// heads), so cuBLAS's strided batches apply. j runs in increasing order and the first j overwrites dK/dV (beta 0),
// the others add (beta 1): every kv head sums its query heads in the CPU's order. With bf16 activations P and dS are
// rounded to bf16 copies for the GEMMs that read them (cuBLAS takes A and B of one type), and dK/dV of a sequence are
// summed in f32 and rounded once into dk/dv at the end of the sequence.
//
// Workspace (one device allocation, grown on demand, stream-ordered on the Blas stream): per unit (a kv head of
// the current chunk) seq*seq f32 scores, plus in backward seq*seq f32 dP, plus with bf16 the bf16 copies of P
// (and dS); with bf16 in backward also two (seq, n_kv_heads*head_dim) f32 accumulators. The chunk c is the
// largest number of kv heads whose scores (and copies) fit the workspace cap (at least one, whatever its size).
// Masked entries (key > query) are computed by the GEMMs and set to exactly 0 by the kernels, as the CPU op does.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/kernel_support.cuh"
#include "kernel_math/attention_math.hpp"

namespace llama3::cuda {
namespace {

using namespace kernels;
using namespace kernel_math;

constexpr int kSoftmaxThreads = 256;
// Row `row` of the chunk's scores (unit u = row / seq, query t = row % seq) sees keys 0..t. In place: p = softmax
// over the visible entries, 0 beyond; p_copy (may be null) receives p rounded to T instead of the f32 row.
// lse[u * lse_unit_stride + t] = max + log(sum).
template <typename T>
__global__ void causal_softmax_kernel(float* s, T* p_copy, float* lse, int64_t lse_unit_stride, int64_t seq) {
  __shared__ ReduceScratch scratch;
  const int64_t row = blockIdx.x;
  const int64_t u = row / seq, t = row - u * seq, valid = causal_visible_keys(t);
  float* x = s + row * seq;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float e = softmax_exp(x[j], mx);
    x[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);
  const float inv = softmax_inverse(sum);
  if (p_copy != nullptr) {
    T* pc = p_copy + row * seq;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) store(pc, j, x[j] * inv);
    for (int64_t j = valid + threadIdx.x; j < seq; j += blockDim.x) store(pc, j, 0.0f);
  } else {
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) x[j] *= inv;
    for (int64_t j = valid + threadIdx.x; j < seq; j += blockDim.x) x[j] = 0.0f;
  }
  if (threadIdx.x == 0) lse[u * lse_unit_stride + t] = softmax_log_sum_exp(mx, sum);
}

// s: scaled scores in, P out (f32, in place). dp: dP in; dS out in place when ds_copy is null. p_copy / ds_copy
// (both null or both set): P and dS rounded to T. Masked entries: P = dS = 0.
template <typename T>
__global__ void causal_softmax_backward_kernel(float* s, float* dp, T* p_copy, T* ds_copy, const float* lse,
                                               int64_t lse_unit_stride, int64_t seq) {
  __shared__ ReduceScratch scratch;
  const int64_t row = blockIdx.x;
  const int64_t u = row / seq, t = row - u * seq, valid = causal_visible_keys(t);
  float* x = s + row * seq;
  float* d = dp + row * seq;
  const float row_lse = lse[u * lse_unit_stride + t];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float p = softmax_prob_from_lse(x[j], row_lse);
    x[j] = p;
    dot += p * d[j];
  }
  dot = block_sum(dot, scratch);
  if (p_copy != nullptr) {
    T* pc = p_copy + row * seq;
    T* dc = ds_copy + row * seq;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
      store(pc, j, x[j]);
      store(dc, j, softmax_grad(x[j], d[j], dot));
    }
    for (int64_t j = valid + threadIdx.x; j < seq; j += blockDim.x) {
      store(pc, j, 0.0f);
      store(dc, j, 0.0f);
    }
  } else {
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) d[j] = softmax_grad(x[j], d[j], dot);
    for (int64_t j = valid + threadIdx.x; j < seq; j += blockDim.x) {
      x[j] = 0.0f;
      d[j] = 0.0f;
    }
  }
}

// dst (rows, cols; row stride ld_dst) = src (rows, cols; row stride ld_src) rounded to T.
template <typename T>
__global__ void store_rows_kernel(const float* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows,
                                  int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t r = idx / cols, c = idx - r * cols;
    store(dst, r * ld_dst + c, src[r * ld_src + c]);
  }
}

void check_dims(const AttentionDims& d, const char* op) {
  const std::string shape = std::string(op) + ": batch " + std::to_string(d.batch) + ", seq " + std::to_string(d.seq) +
                            ", heads " + std::to_string(d.n_heads) + ", kv heads " + std::to_string(d.n_kv_heads) +
                            ", head_dim " + std::to_string(d.head_dim);
  if (d.batch < 0 || d.seq < 0 || d.n_heads <= 0 || d.n_kv_heads <= 0 || d.head_dim <= 0) {
    throw zero3::InvalidArgument(shape + ": batch and seq must be >= 0, the others > 0");
  }
  if (d.n_heads % d.n_kv_heads != 0) throw zero3::InvalidArgument(shape + ": n_kv_heads must divide n_heads");
}

void check_ld(const char* op, const char* name, int64_t ld, int64_t width) {
  if (ld < width) {
    throw zero3::InvalidArgument(std::string(op) + ": " + name + " = " + std::to_string(ld) +
                                 " is smaller than the row width " + std::to_string(width));
  }
}

// Byte offsets of the workspace regions for `units` kv heads per chunk.
struct Plan {
  int64_t units = 0;
  int64_t s = 0, dp = 0, p_copy = 0, ds_copy = 0, dk_acc = 0, dv_acc = 0, bytes = 0;
};

Plan make_plan(const AttentionDims& d, DType act, bool backward, int64_t workspace_cap) {
  const bool copies = act != DType::f32;
  const int64_t scores = d.seq * d.seq;
  const int64_t per_unit = scores * (4 + (backward ? 4 : 0) + (copies ? 2 : 0) + (copies && backward ? 2 : 0));
  Plan p;
  // As many kv heads per chunk as the cap allows, then balanced: 8 heads under a cap of 5 run as 4 + 4 (same
  // number of chunks as 5 + 3, less workspace).
  const int64_t fit = std::clamp<int64_t>(workspace_cap / std::max<int64_t>(per_unit, 1), 1, d.n_kv_heads);
  const int64_t chunks = (d.n_kv_heads + fit - 1) / fit;
  p.units = (d.n_kv_heads + chunks - 1) / chunks;
  int64_t at = 0;
  auto region = [&](int64_t bytes) {
    const int64_t start = at;
    at += align_up(bytes);
    return start;
  };
  p.s = region(p.units * scores * 4);
  if (backward) p.dp = region(p.units * scores * 4);
  if (copies) p.p_copy = region(p.units * scores * 2);
  if (copies && backward) {
    p.ds_copy = region(p.units * scores * 2);
    p.dk_acc = region(d.seq * d.n_kv_heads * d.head_dim * 4);
    p.dv_acc = region(d.seq * d.n_kv_heads * d.head_dim * 4);
  }
  p.bytes = at;
  return p;
}

const void* offset(const void* base, int64_t elements, int64_t element_size) {
  return static_cast<const char*>(base) + elements * element_size;
}
void* offset(void* base, int64_t elements, int64_t element_size) {
  return static_cast<char*>(base) + elements * element_size;
}

}  // namespace

struct Attention::Impl {
  Impl(Blas& b, int64_t cap) : blas(b), workspace(b.device()), workspace_cap(cap) {}

  Blas& blas;
  StreamWorkspace workspace;  // on the Blas stream
  int64_t workspace_cap;
};

Attention::Attention(Blas& blas, int64_t workspace_cap) {
  if (workspace_cap <= 0) {
    throw zero3::InvalidArgument("Attention: workspace_cap = " + std::to_string(workspace_cap) + " must be > 0");
  }
  impl_ = std::make_unique<Impl>(blas, workspace_cap);
}
Attention::~Attention() = default;

int64_t Attention::workspace_bytes() const { return impl_->workspace.bytes(); }

void Attention::forward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
                        int64_t ldv, void* out, int64_t ldo, float* lse, DType act) {
  const char* op = "Attention::forward";
  check_dims(d, op);
  detail::check_act(act, op);
  const int64_t seq = d.seq, hd = d.head_dim, group = attention_group(d.n_heads, d.n_kv_heads);
  check_ld(op, "ldq", ldq, d.n_heads * hd);
  check_ld(op, "ldk", ldk, d.n_kv_heads * hd);
  check_ld(op, "ldv", ldv, d.n_kv_heads * hd);
  check_ld(op, "ldo", ldo, d.n_heads * hd);
  if (d.batch == 0 || seq == 0) return;
  const int64_t es = static_cast<int64_t>(zero3::dtype_size(act));
  const float scale = attention_scale<float>(hd);
  const Plan plan = make_plan(d, act, false, impl_->workspace_cap);
  char* ws = impl_->workspace.reserve(plan.bytes);
  float* s = reinterpret_cast<float*>(ws + plan.s);
  void* p_copy = act == DType::f32 ? nullptr : ws + plan.p_copy;
  const void* p_mat = act == DType::f32 ? static_cast<void*>(s) : p_copy;
  Blas& blas = impl_->blas;
  cudaStream_t stream = blas.stream();
  const int64_t scores = seq * seq;
  const std::vector<AttentionHeadBatch> batches = attention_head_batches(d.n_heads, d.n_kv_heads, plan.units);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (const AttentionHeadBatch& batch : batches) {
      const int64_t c = batch.count, g0 = batch.first_kv, h0 = batch.first_query;
      const void* qb = offset(q, b * seq * ldq + h0 * hd, es);
      const void* kb = offset(k, b * seq * ldk + g0 * hd, es);
      const void* vb = offset(v, b * seq * ldv + g0 * hd, es);
      void* ob = offset(out, b * seq * ldo + h0 * hd, es);
      float* lse_b = lse + attention_lse_index(b, h0, 0, d.n_heads, seq);
      blas.gemm_strided_batched(false, true, seq, seq, hd, scale, qb, ldq, group * hd, kb, ldk, hd, 0.0f, s, seq,
                                scores, c, act, DType::f32);
      dispatch_act(act, op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        causal_softmax_kernel<T><<<row_blocks(c * seq, op), kSoftmaxThreads, 0, stream>>>(s, static_cast<T*>(p_copy),
                                                                                          lse_b, group * seq, seq);
        LLAMA3_CUDA_CHECK_LAUNCH("causal_softmax_kernel");
      });
      blas.gemm_strided_batched(false, false, seq, hd, seq, 1.0f, p_mat, seq, scores, vb, ldv, hd, 0.0f, ob, ldo,
                                group * hd, c, act, act);
    }
  }
}

void Attention::backward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
                         int64_t ldv, const void* out, int64_t ldo, const float* lse, const void* dout, int64_t lddo,
                         void* dq, int64_t lddq, void* dk, int64_t lddk, void* dv, int64_t lddv, DType act) {
  const char* op = "Attention::backward";
  check_dims(d, op);
  detail::check_act(act, op);
  const int64_t seq = d.seq, hd = d.head_dim, group = attention_group(d.n_heads, d.n_kv_heads);
  const int64_t kv_width = d.n_kv_heads * hd;
  check_ld(op, "ldq", ldq, d.n_heads * hd);
  check_ld(op, "ldk", ldk, kv_width);
  check_ld(op, "ldv", ldv, kv_width);
  check_ld(op, "ldo", ldo, d.n_heads * hd);
  check_ld(op, "lddo", lddo, d.n_heads * hd);
  check_ld(op, "lddq", lddq, d.n_heads * hd);
  check_ld(op, "lddk", lddk, kv_width);
  check_ld(op, "lddv", lddv, kv_width);
  (void)out;  // P is recomputed from lse; rowsum(P * dP) from P and dP, as the CPU op does
  if (d.batch == 0 || seq == 0) return;
  const bool f32 = act == DType::f32;
  const int64_t es = static_cast<int64_t>(zero3::dtype_size(act));
  const float scale = attention_scale<float>(hd);
  const Plan plan = make_plan(d, act, true, impl_->workspace_cap);
  const std::vector<AttentionHeadBatch> batches = attention_head_batches(d.n_heads, d.n_kv_heads, plan.units);
  char* ws = impl_->workspace.reserve(plan.bytes);
  float* s = reinterpret_cast<float*>(ws + plan.s);
  float* dp = reinterpret_cast<float*>(ws + plan.dp);
  void* p_copy = f32 ? nullptr : ws + plan.p_copy;
  void* ds_copy = f32 ? nullptr : ws + plan.ds_copy;
  float* dk_acc = f32 ? nullptr : reinterpret_cast<float*>(ws + plan.dk_acc);
  float* dv_acc = f32 ? nullptr : reinterpret_cast<float*>(ws + plan.dv_acc);
  const void* p_mat = f32 ? static_cast<void*>(s) : p_copy;
  const void* ds_mat = f32 ? static_cast<void*>(dp) : ds_copy;
  Blas& blas = impl_->blas;
  cudaStream_t stream = blas.stream();
  const int64_t scores = seq * seq;
  for (int64_t b = 0; b < d.batch; ++b) {
    // dK/dV of this sequence: straight into dk/dv (f32), or into f32 accumulators rounded at the end (bf16).
    void* dk_seq = f32 ? offset(dk, b * seq * lddk, es) : static_cast<void*>(dk_acc);
    void* dv_seq = f32 ? offset(dv, b * seq * lddv, es) : static_cast<void*>(dv_acc);
    const int64_t ld_dk = f32 ? lddk : kv_width, ld_dv = f32 ? lddv : kv_width;
    for (const AttentionHeadBatch& batch : batches) {
      const float beta_kv = batch.first_of_group ? 0.0f : 1.0f;
      const int64_t c = batch.count, g0 = batch.first_kv, h0 = batch.first_query;
      const void* qb = offset(q, b * seq * ldq + h0 * hd, es);
      const void* kb = offset(k, b * seq * ldk + g0 * hd, es);
      const void* vb = offset(v, b * seq * ldv + g0 * hd, es);
      const void* dob = offset(dout, b * seq * lddo + h0 * hd, es);
      void* dqb = offset(dq, b * seq * lddq + h0 * hd, es);
      void* dkb = offset(dk_seq, g0 * hd, 4);  // f32 either way
      void* dvb = offset(dv_seq, g0 * hd, 4);
      const float* lse_b = lse + attention_lse_index(b, h0, 0, d.n_heads, seq);
      blas.gemm_strided_batched(false, true, seq, seq, hd, scale, qb, ldq, group * hd, kb, ldk, hd, 0.0f, s, seq,
                                scores, c, act, DType::f32);
      blas.gemm_strided_batched(false, true, seq, seq, hd, 1.0f, dob, lddo, group * hd, vb, ldv, hd, 0.0f, dp, seq,
                                scores, c, act, DType::f32);
      dispatch_act(act, op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        causal_softmax_backward_kernel<T><<<row_blocks(c * seq, op), kSoftmaxThreads, 0, stream>>>(
            s, dp, static_cast<T*>(p_copy), static_cast<T*>(ds_copy), lse_b, group * seq, seq);
        LLAMA3_CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
      });
      // dV_g (+)= P^T dO_h ; dQ_h = scale dS K_g ; dK_g (+)= scale dS^T Q_h
      blas.gemm_strided_batched(true, false, seq, hd, seq, 1.0f, p_mat, seq, scores, dob, lddo, group * hd, beta_kv,
                                dvb, ld_dv, hd, c, act, DType::f32);
      blas.gemm_strided_batched(false, false, seq, hd, seq, scale, ds_mat, seq, scores, kb, ldk, hd, 0.0f, dqb, lddq,
                                group * hd, c, act, act);
      blas.gemm_strided_batched(true, false, seq, hd, seq, scale, ds_mat, seq, scores, qb, ldq, group * hd, beta_kv,
                                dkb, ld_dk, hd, c, act, DType::f32);
    }
    if (!f32) {
      dispatch_act(act, op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int64_t n = seq * kv_width;
        store_rows_kernel<T><<<element_blocks(n), kElementThreads, 0, stream>>>(
            dk_acc, kv_width, static_cast<T*>(offset(dk, b * seq * lddk, es)), lddk, seq, kv_width);
        LLAMA3_CUDA_CHECK_LAUNCH("store_rows_kernel (dk)");
        store_rows_kernel<T><<<element_blocks(n), kElementThreads, 0, stream>>>(
            dv_acc, kv_width, static_cast<T*>(offset(dv, b * seq * lddv, es)), lddv, seq, kv_width);
        LLAMA3_CUDA_CHECK_LAUNCH("store_rows_kernel (dv)");
      });
    }
  }
}

}  // namespace llama3::cuda

// Grouped-query causal self-attention over already projected and rotated q, k, v (Hugging Face's eager
// LlamaAttention after apply_rotary_pos_emb):
//
//   for each sequence b, query head h, kv head g = h / (n_heads / n_kv_heads):
//     S = (Q_bh K_bg^T) / sqrt(head_dim)   (seq, seq)
//     P = causal_softmax(S) row by row      (query t sees keys 0..t)
//     O_bh = P V_bg                         (seq, head_dim)
//
// Layouts: token rows r = b*seq + t; q has n_heads*head_dim columns per row (head h at column h*head_dim),
// k and v have n_kv_heads*head_dim; out has n_heads*head_dim. Every matrix has its own row stride, so q, k, v
// can be column blocks of the fused (tokens, q+k+v) projection output.
//
// Algorithm (CPU now, the same plan on GPU): per (b, h) two GEMMs through gemm() with a (seq x seq) score
// scratch and the causal softmax row kernel between them; forward saves only the log-sum-exp per (b, h, t)
// and backward recomputes P from it (no (seq x seq) tensor is kept between forward and backward).
#pragma once

#include <cstdint>

namespace llama3 {

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Strided (row-major) operands. lse: (batch, n_heads, seq), written by forward, read by backward.
template <typename T>
struct AttentionIO {
  const T* q = nullptr;
  int64_t ldq = 0;
  const T* k = nullptr;
  int64_t ldk = 0;
  const T* v = nullptr;
  int64_t ldv = 0;
};

template <typename T>
void attention_forward(const AttentionShape& s, const AttentionIO<T>& in, T* out, int64_t ldo, T* lse);

// dq, dk, dv are overwritten (each kv head's gradient sums over its group of query heads).
// dq/dk/dv may be column blocks of one buffer (strides lddq, lddk, lddv).
template <typename T>
void attention_backward(const AttentionShape& s, const AttentionIO<T>& in, const T* lse, const T* dout, int64_t lddo,
                        T* dq, int64_t lddq, T* dk, int64_t lddk, T* dv, int64_t lddv);

// Throws zero3::InvalidArgument unless the shape is usable (positive, heads divisible by kv heads).
void check_attention_shape(const AttentionShape& s);

}  // namespace llama3

// The unfused attention's row arithmetic and its grouped-query index mapping, once for the CPU op (ops/attention.*,
// ops/softmax.hpp) and the CUDA fallback path (cuda/attention.cu; cuDNN's fused kernels are cuDNN's own).
//
// Scores arrive scaled by attention_scale(head_dim) = head_dim**-0.5 (rounded once from double). Query t sees keys
// 0..t (causal_visible_keys). A row's softmax over its visible keys, with m their max:
//
//   e_s = exp(x_s - m),  sum = sum_s e_s,  p_s = e_s * (1 / sum),  lse = m + log(sum)    (masked p_s = 0)
//
// backward recomputes p_s = exp(x_s - lse) and forms dS_s = p_s * (dP_s - sum_r p_r dP_r).
//
// Grouped-query heads: query head h reads kv head h / group, group = n_heads / n_kv_heads; the kv heads' gradients
// sum over their query heads. The CUDA path runs, per sequence, batches of query heads that share an index j
// within their group (attention_head_batches), which keeps every operand at a constant stride for cuBLAS.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "zero3/host_device.hpp"

namespace llama3::kernel_math {

template <typename T>
ZERO3_HOST_DEVICE T attention_scale(int64_t head_dim) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

ZERO3_HOST_DEVICE int64_t causal_visible_keys(int64_t query) { return query + 1; }

// ---- The causal softmax of one row, by term. ----

template <typename T>
ZERO3_HOST_DEVICE T softmax_exp(T x, T mx) {
  return std::exp(x - mx);
}

template <typename T>
ZERO3_HOST_DEVICE T softmax_inverse(T sum) {
  return T(1) / sum;
}

template <typename T>
ZERO3_HOST_DEVICE T softmax_log_sum_exp(T mx, T sum) {
  return mx + std::log(sum);
}

template <typename T>
ZERO3_HOST_DEVICE T softmax_prob_from_lse(T x, T lse) {
  return std::exp(x - lse);
}

// dS_s from p_s, dP_s and the row's dot = sum_r p_r dP_r.
template <typename T>
ZERO3_HOST_DEVICE T softmax_grad(T p, T dp, T dot) {
  return p * (dp - dot);
}

// ---- Grouped-query index mapping. ----

ZERO3_HOST_DEVICE int64_t attention_group(int64_t n_heads, int64_t n_kv_heads) { return n_heads / n_kv_heads; }

ZERO3_HOST_DEVICE int64_t attention_kv_head(int64_t query_head, int64_t group) { return query_head / group; }

// The query head with index j < group within kv head g's group.
ZERO3_HOST_DEVICE int64_t attention_query_head(int64_t kv_head, int64_t j, int64_t group) {
  return kv_head * group + j;
}

// Where the log-sum-exp of (sequence b, query head h, token t) lives in the (batch, n_heads, seq) array.
ZERO3_HOST_DEVICE int64_t attention_lse_index(int64_t b, int64_t h, int64_t t, int64_t n_heads, int64_t seq) {
  return (b * n_heads + h) * seq + t;
}

// One batched call of the CUDA path within a sequence: the query heads attention_query_head(first_kv + u, j, group)
// for u < count, on kv heads first_kv + u. In a batch, consecutive query heads are `group` heads apart and
// consecutive kv heads one apart (the strides cuBLAS's strided batches take).
struct AttentionHeadBatch {
  int64_t j;
  int64_t first_kv;
  int64_t count;
  int64_t first_query;  // attention_query_head(first_kv, j, group)
  bool first_of_group;  // j == 0: dK/dV of these kv heads are written (beta 0), later batches add to them
};

// Every query head of a sequence once, in the order the CUDA path runs them: j outer (so each kv head adds its
// query heads' gradients in increasing head order, the CPU op's order), chunks of at most kv_per_batch kv heads
// inner.
inline std::vector<AttentionHeadBatch> attention_head_batches(int64_t n_heads, int64_t n_kv_heads,
                                                              int64_t kv_per_batch) {
  const int64_t group = attention_group(n_heads, n_kv_heads);
  std::vector<AttentionHeadBatch> batches;
  for (int64_t j = 0; j < group; ++j) {
    for (int64_t g0 = 0; g0 < n_kv_heads; g0 += kv_per_batch) {
      batches.push_back({j, g0, std::min(kv_per_batch, n_kv_heads - g0), attention_query_head(g0, j, group), j == 0});
    }
  }
  return batches;
}

}  // namespace llama3::kernel_math

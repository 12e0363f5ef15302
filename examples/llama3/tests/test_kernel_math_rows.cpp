// The row arithmetic of the cross-entropy kernel and of the unfused attention (kernel_math/), run on the host the
// way the CUDA kernels run it (cuda_block_order.hpp), against the CPU ops; the element kernels are in
// test_kernel_math.cpp.
//
// Cross-entropy: the kernel's exponentials are kernel_math's ShiftedExp (float), the CPU op's ExactExp (double);
// at Llama-3's 128,256 entries each row's loss and every gradient element must be within 1e-6 relative of a
// compensated double reference and of the CPU op (the bound the GPU test sets for the kernel itself).
// Attention: the CUDA path's batches of query heads (8 query heads over 2 kv heads, batches of 1 and 2 kv heads),
// its log-sum-exp indexing and its causal softmax rows, with the GEMMs written out in float, against the CPU op in
// double: 1e-5 of each tensor's largest magnitude (f32 throughout, sums of up to seq terms in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cross_entropy_rows.hpp"
#include "cuda_block_order.hpp"
#include "grad_check.hpp"
#include "kernel_math/attention_math.hpp"
#include "kernel_math/cross_entropy_math.hpp"
#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"

using namespace llama3;
using namespace llama3::kernel_math;
using llama3::testing::block_max;
using llama3::testing::block_sum;
using llama3::testing::max_rel_diff;
using llama3::testing::random_vector;

namespace {

// ---- Cross-entropy: cross_entropy_rows_kernel, one block of kLossThreads per row. ----

constexpr int kLossThreads = 512;

// The row's loss; the row becomes its gradient (the kernel's in-place f32 form).
float cross_entropy_like_cuda(float* x, int64_t vocab, int32_t target, float grad_scale) {
  if (target == kIgnoreIndex || target < 0 || target >= vocab) {
    std::fill(x, x + vocab, 0.0f);
    return target == kIgnoreIndex ? 0.0f : NAN;
  }
  const float xt = x[target];
  std::vector<float> mx(kLossThreads, -INFINITY);
  for (int64_t j = 0; j < vocab; ++j) mx[j % kLossThreads] = std::fmax(mx[j % kLossThreads], x[j]);
  const float m = block_max(mx);
  std::vector<double> rest(kLossThreads, 0.0), ties(kLossThreads, 0.0);
  for (int t = 0; t < kLossThreads; ++t) {
    CrossEntropySums part;
    for (int64_t j = t; j < vocab; j += kLossThreads) cross_entropy_add<ShiftedExp>(part, x[j], m);
    rest[t] = part.rest;
    ties[t] = part.ties;
  }
  const double log_sum = cross_entropy_log_sum(block_sum(rest), block_sum(ties));
  const double dt = cross_entropy_target_shift(xt, m);
  for (int64_t j = 0; j < vocab; ++j) {
    x[j] = j == target ? cross_entropy_target_grad(dt, log_sum, grad_scale)
                       : ShiftedExp::grad(x[j], static_cast<double>(m), log_sum, grad_scale);
  }
  return static_cast<float>(cross_entropy_loss(log_sum, dt));
}

double rel(double got, double want) { return want == 0 ? std::fabs(got) : std::fabs(got - want) / std::fabs(want); }

TEST(KernelMath, CrossEntropyRowsAtLlama3VocabularyAgainstTheCpuOpAndDouble) {
  using llama3::testing::max_elementwise_rel;
  const auto c = llama3::testing::llm_like_rows(llama3::testing::kLlama3Vocab, 2024);
  const float scale = 1.0f / 3;
  const auto ref = llama3::testing::cross_entropy_reference(c, scale);
  double worst_loss = 0, worst_grad = 0, worst_loss_cpu = 0, worst_grad_cpu = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<float> gpu(c.logits.begin() + r * c.vocab, c.logits.begin() + (r + 1) * c.vocab), cpu = gpu;
    const float loss = cross_entropy_like_cuda(gpu.data(), c.vocab, c.targets[r], scale);
    const float cpu_loss = cross_entropy_row<float>(cpu.data(), c.vocab, c.targets[r], scale, true);
    const double* want = ref.grad.data() + r * c.vocab;
    std::vector<double> cpu_d(cpu.begin(), cpu.end());
    const double e_loss = rel(loss, ref.loss[r]), e_grad = max_elementwise_rel(gpu.data(), want, c.vocab);
    const double e_loss_cpu = rel(loss, cpu_loss), e_grad_cpu = max_elementwise_rel(gpu.data(), cpu_d.data(), c.vocab);
    EXPECT_LE(e_loss, 1e-6) << c.kinds[r];
    EXPECT_LE(e_grad, 1e-6) << c.kinds[r];
    EXPECT_LE(e_loss_cpu, 1e-6) << c.kinds[r];
    EXPECT_LE(e_grad_cpu, 1e-6) << c.kinds[r];
    worst_loss = std::max(worst_loss, e_loss);
    worst_grad = std::max(worst_grad, e_grad);
    worst_loss_cpu = std::max(worst_loss_cpu, e_loss_cpu);
    worst_grad_cpu = std::max(worst_grad_cpu, e_grad_cpu);
    if (c.targets[r] == kIgnoreIndex) {
      EXPECT_EQ(loss, 0.0f);
      EXPECT_TRUE(std::all_of(gpu.begin(), gpu.end(), [](float g) { return g == 0.0f; }));
    }
  }
  std::printf(
      "vocabulary %lld, the kernel's arithmetic: worst loss error %.2g and gradient element error %.2g "
      "relative to double; %.2g and %.2g relative to the CPU op\n",
      static_cast<long long>(c.vocab), worst_loss, worst_grad, worst_loss_cpu, worst_grad_cpu);
}

TEST(KernelMath, CrossEntropyTiesOddVocabularyAndBadTargets) {
  // Three logits tie for the largest (ties counted apart from the rest), an odd vocabulary, a target outside the
  // vocabulary (the kernel's guard: NaN loss, zero gradient; the CPU op refuses it before it starts).
  const int64_t vocab = 1001;
  auto x = random_vector<float>(vocab, 51, 3.0);
  const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
  x[3] = x[500] = x[1000] = top;
  for (int32_t target : {500, 7}) {
    std::vector<float> gpu = x, cpu = x;
    const float loss = cross_entropy_like_cuda(gpu.data(), vocab, target, 0.5f);
    const float cpu_loss = cross_entropy_row<float>(cpu.data(), vocab, target, 0.5f, true);
    EXPECT_LE(rel(loss, cpu_loss), 1e-6) << "target " << target;
    EXPECT_LE(max_rel_diff(gpu.data(), cpu.data(), vocab), 1e-6) << "target " << target;
  }
  std::vector<float> bad = x;
  EXPECT_TRUE(std::isnan(cross_entropy_like_cuda(bad.data(), vocab, static_cast<int32_t>(vocab), 1.0f)));
  EXPECT_TRUE(std::all_of(bad.begin(), bad.end(), [](float g) { return g == 0.0f; }));
}

// ---- Attention: Attention::forward/backward of cuda/attention.cu, f32. ----

constexpr int kSoftmaxThreads = 256;

// C (m x n, row stride ldc) = alpha * op(A) op(B) + beta * C, in float: a batched GEMM's one matrix.
void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
    }
}

// causal_softmax_kernel on one row: p in place, returns the log-sum-exp.
float softmax_row_like_cuda(float* x, int64_t seq, int64_t t) {
  const int64_t valid = causal_visible_keys(t);
  std::vector<float> mx(kSoftmaxThreads, -INFINITY), sum(kSoftmaxThreads, 0.0f);
  for (int64_t j = 0; j < valid; ++j) mx[j % kSoftmaxThreads] = std::fmax(mx[j % kSoftmaxThreads], x[j]);
  const float m = block_max(mx);
  for (int64_t j = 0; j < valid; ++j) {
    x[j] = softmax_exp(x[j], m);
    sum[j % kSoftmaxThreads] += x[j];
  }
  const float s = block_sum(sum), inv = softmax_inverse(s);
  for (int64_t j = 0; j < valid; ++j) x[j] *= inv;
  for (int64_t j = valid; j < seq; ++j) x[j] = 0.0f;
  return softmax_log_sum_exp(m, s);
}

// causal_softmax_backward_kernel on one row: s (scores) becomes P, dp becomes dS.
void softmax_backward_row_like_cuda(float* s, float* dp, int64_t seq, int64_t t, float lse) {
  const int64_t valid = causal_visible_keys(t);
  std::vector<float> dot(kSoftmaxThreads, 0.0f);
  for (int64_t j = 0; j < valid; ++j) {
    s[j] = softmax_prob_from_lse(s[j], lse);
    dot[j % kSoftmaxThreads] += s[j] * dp[j];
  }
  const float d = block_sum(dot);
  for (int64_t j = 0; j < valid; ++j) dp[j] = softmax_grad(s[j], dp[j], d);
  for (int64_t j = valid; j < seq; ++j) s[j] = dp[j] = 0.0f;
}

struct Qkv {
  AttentionShape shape;
  int64_t ld = 0;                  // q | k | v columns of one fused row, padded
  std::vector<float> buf;          // (batch * seq, ld)
  int64_t qo = 0, ko = 0, vo = 0;  // column offsets
};

// The CUDA path: per sequence the batches of attention_head_batches; within a batch, unit u is query head
// first_query + u * group on kv head first_kv + u, its lse row at lse_b + u * (group * seq) (the kernel's stride).
void attention_like_cuda(const Qkv& in, int64_t kv_per_batch, const std::vector<float>& dout, std::vector<float>& out,
                         std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dk,
                         std::vector<float>& dv) {
  const AttentionShape& d = in.shape;
  const int64_t seq = d.seq, hd = d.head_dim, group = attention_group(d.n_heads, d.n_kv_heads), ld = in.ld;
  const int64_t qw = d.n_heads * hd, kvw = d.n_kv_heads * hd;
  const float scale = attention_scale<float>(hd);
  const auto batches = attention_head_batches(d.n_heads, d.n_kv_heads, kv_per_batch);
  std::vector<float> s(seq * seq), dp(seq * seq);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* base = in.buf.data() + b * seq * ld;
    for (const AttentionHeadBatch& batch : batches) {
      const int64_t lse_b = attention_lse_index(b, batch.first_query, 0, d.n_heads, seq);
      for (int64_t u = 0; u < batch.count; ++u) {
        const int64_t h = batch.first_query + u * group, g = batch.first_kv + u;
        EXPECT_EQ(g, attention_kv_head(h, group));
        const float* q = base + in.qo + h * hd;
        const float* k = base + in.ko + g * hd;
        const float* v = base + in.vo + g * hd;
        float* lse_u = lse.data() + lse_b + u * group * seq;
        // forward
        gemm_f32(false, true, seq, seq, hd, scale, q, ld, k, ld, 0.0f, s.data(), seq);
        for (int64_t t = 0; t < seq; ++t) {
          EXPECT_EQ(lse_b + u * group * seq + t, attention_lse_index(b, h, t, d.n_heads, seq));
          lse_u[t] = softmax_row_like_cuda(s.data() + t * seq, seq, t);
        }
        gemm_f32(false, false, seq, hd, seq, 1.0f, s.data(), seq, v, ld, 0.0f, out.data() + b * seq * qw + h * hd, qw);
      }
    }
    for (const AttentionHeadBatch& batch : batches) {
      const float beta_kv = batch.first_of_group ? 0.0f : 1.0f;
      for (int64_t u = 0; u < batch.count; ++u) {
        const int64_t h = batch.first_query + u * group, g = batch.first_kv + u;
        const float* q = base + in.qo + h * hd;
        const float* k = base + in.ko + g * hd;
        const float* v = base + in.vo + g * hd;
        const float* dob = dout.data() + b * seq * qw + h * hd;
        const float* lse_u = lse.data() + attention_lse_index(b, h, 0, d.n_heads, seq);
        gemm_f32(false, true, seq, seq, hd, scale, q, ld, k, ld, 0.0f, s.data(), seq);
        gemm_f32(false, true, seq, seq, hd, 1.0f, dob, qw, v, ld, 0.0f, dp.data(), seq);
        for (int64_t t = 0; t < seq; ++t)
          softmax_backward_row_like_cuda(s.data() + t * seq, dp.data() + t * seq, seq, t, lse_u[t]);
        gemm_f32(true, false, seq, hd, seq, 1.0f, s.data(), seq, dob, qw, beta_kv, dv.data() + b * seq * kvw + g * hd,
                 kvw);
        gemm_f32(false, false, seq, hd, seq, scale, dp.data(), seq, k, ld, 0.0f, dq.data() + b * seq * qw + h * hd, qw);
        gemm_f32(true, false, seq, hd, seq, scale, dp.data(), seq, q, ld, beta_kv, dk.data() + b * seq * kvw + g * hd,
                 kvw);
      }
    }
  }
}

TEST(KernelMath, AttentionHeadBatchesCoverEveryQueryHeadInTheCpuOrder) {
  for (int64_t kv : {1, 2, 3, 8}) {
    for (int64_t group : {1, 3, 4}) {
      for (int64_t per_batch : {int64_t{1}, int64_t{2}, kv}) {
        const int64_t heads = kv * group;
        std::vector<int> seen(heads, 0);
        std::vector<int64_t> last_query_of_kv(kv, -1);
        for (const AttentionHeadBatch& b : attention_head_batches(heads, kv, per_batch)) {
          EXPECT_EQ(b.first_query, attention_query_head(b.first_kv, b.j, group));
          EXPECT_EQ(b.first_of_group, b.j == 0);
          for (int64_t u = 0; u < b.count; ++u) {
            const int64_t h = b.first_query + u * group, g = b.first_kv + u;
            ASSERT_LT(h, heads);
            ++seen[h];
            EXPECT_EQ(attention_kv_head(h, group), g);
            EXPECT_GT(h, last_query_of_kv[g]) << "a kv head must add its query heads in increasing order";
            EXPECT_EQ(b.first_of_group, last_query_of_kv[g] < 0) << "the first query head of a kv head writes";
            last_query_of_kv[g] = h;
          }
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
            << kv << " kv heads, group " << group << ", " << per_batch << " per batch";
      }
    }
  }
}

TEST(KernelMath, AttentionRowsAndGroupedQueryHeadsAgainstTheCpuOp) {
  Qkv in;
  in.shape = {2, 13, 8, 2, 12};  // batch, seq (odd), 8 query heads over 2 kv heads, head_dim
  const AttentionShape& d = in.shape;
  const int64_t qw = d.n_heads * d.head_dim, kvw = d.n_kv_heads * d.head_dim, rows = d.batch * d.seq;
  in.qo = 0;
  in.ko = qw;
  in.vo = qw + kvw;
  in.ld = qw + 2 * kvw + 4;
  in.buf = random_vector<float>(rows * in.ld, 61, 1.5);
  const auto dout = random_vector<float>(rows * qw, 62, 1.0);

  const std::vector<double> bufd(in.buf.begin(), in.buf.end()), doutd(dout.begin(), dout.end());
  const AttentionIO<double> io{bufd.data() + in.qo, in.ld, bufd.data() + in.ko, in.ld, bufd.data() + in.vo, in.ld};
  std::vector<double> out_ref(rows * qw), lse_ref(d.batch * d.n_heads * d.seq), dq_ref(rows * qw), dk_ref(rows * kvw),
      dv_ref(rows * kvw);
  attention_forward<double>(d, io, out_ref.data(), qw, lse_ref.data());
  attention_backward<double>(d, io, lse_ref.data(), doutd.data(), qw, dq_ref.data(), qw, dk_ref.data(), kvw,
                             dv_ref.data(), kvw);
  for (int64_t per_batch : {1, 2}) {  // a chunk of one kv head (two batches per j) and of both
    SCOPED_TRACE(std::to_string(per_batch) + " kv heads per batch");
    std::vector<float> out(rows * qw, NAN), lse(lse_ref.size(), NAN), dq(rows * qw, NAN), dk(rows * kvw, NAN),
        dv(rows * kvw, NAN);
    attention_like_cuda(in, per_batch, dout, out, lse, dq, dk, dv);
    EXPECT_LE(max_rel_diff(out.data(), out_ref.data(), out.size()), 1e-5);
    EXPECT_LE(max_rel_diff(lse.data(), lse_ref.data(), lse.size()), 1e-5);
    EXPECT_LE(max_rel_diff(dq.data(), dq_ref.data(), dq.size()), 1e-5);
    EXPECT_LE(max_rel_diff(dk.data(), dk_ref.data(), dk.size()), 1e-5);
    EXPECT_LE(max_rel_diff(dv.data(), dv_ref.data(), dv.size()), 1e-5);
  }
}

}  // namespace

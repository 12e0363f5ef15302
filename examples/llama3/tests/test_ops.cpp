// Every Llama-3 op: backward against central finite differences in double, forward against a direct formula,
// on odd shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cross_entropy_rows.hpp"
#include "grad_check.hpp"
#include "model_config.hpp"
#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"
#include "ops/linear.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/rope.hpp"
#include "ops/softmax.hpp"
#include "ops/swiglu.hpp"
#include "zero3/error.hpp"

using namespace llama3;
using llama3::testing::dot;
using llama3::testing::expect_gradient;
using llama3::testing::max_rel_diff;
using llama3::testing::random_vector;

namespace {

// C = alpha op(A) op(B) + beta C in double, straight from the definition.
std::vector<double> naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                               const std::vector<double>& a, int64_t lda, const std::vector<double>& b, int64_t ldb,
                               double beta, std::vector<double> c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
    }
  return c;
}

}  // namespace

TEST(Gemm, AllTransposesAndStridesMatchTheDefinition) {
  const int64_t m = 5, n = 7, k = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      auto a = random_vector<double>(static_cast<size_t>((ta ? k : m) * lda), 1);
      auto b = random_vector<double>(static_cast<size_t>((tb ? n : k) * ldb), 2);
      auto c0 = random_vector<double>(static_cast<size_t>(m * ldc), 3);
      auto want = naive_gemm(ta, tb, m, n, k, 0.5, a, lda, b, ldb, 2.0, c0, ldc);
      auto c1 = c0, c2 = c0;
      gemm<double>(ta, tb, m, n, k, 0.5, a.data(), lda, b.data(), ldb, 2.0, c1.data(), ldc);
      gemm_loop<double>(ta, tb, m, n, k, 0.5, a.data(), lda, b.data(), ldb, 2.0, c2.data(), ldc);
      EXPECT_LT(max_rel_diff(c1.data(), want.data(), want.size()), 1e-14) << ta << tb;
      EXPECT_LT(max_rel_diff(c2.data(), want.data(), want.size()), 1e-14) << ta << tb;
      // float path too
      std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(c0.begin(), c0.end());
      gemm<float>(ta, tb, m, n, k, 0.5f, af.data(), lda, bf.data(), ldb, 2.0f, cf.data(), ldc);
      EXPECT_LT(max_rel_diff(cf.data(), want.data(), want.size()), 1e-6) << ta << tb;
    }
  }
}

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  std::vector<float> a{1, 2}, b{3, 4}, c{NAN};
  gemm<float>(false, true, 1, 1, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 1);
  EXPECT_EQ(c[0], 11.0f);
  c[0] = NAN;
  gemm_loop<float>(false, true, 1, 1, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 1);
  EXPECT_EQ(c[0], 11.0f);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = random_vector<double>(n * in, 10), w = random_vector<double>(out * in, 11),
       r = random_vector<double>(n * out, 12);
  auto loss = [&] {
    std::vector<double> y(n * out);
    linear_forward(x.data(), in, w.data(), y.data(), out, n, in, out);
    return dot(y, r);
  };
  std::vector<double> dx(n * in, 99.0), dw(out * in, 0.0);
  linear_backward(x.data(), in, w.data(), r.data(), out, dx.data(), in, dw.data(), n, in, out, false);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(w, dw, loss, "dw");
  // accumulate_dx adds, dw always adds
  auto dx2 = dx, dw2 = dw;
  linear_backward(x.data(), in, w.data(), r.data(), out, dx2.data(), in, dw2.data(), n, in, out, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 2 * dx[i], 1e-12);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-12);
}

TEST(Embedding, GathersRowsAndScattersGradientsWithRepeats) {
  const int64_t vocab = 6, hidden = 5, n = 7;
  std::vector<int32_t> ids{3, 0, 3, 5, 1, 3, 0};
  auto table = random_vector<double>(vocab * hidden, 20), r = random_vector<double>(n * hidden, 21);
  std::vector<double> x(n * hidden);
  embedding_forward(ids.data(), n, table.data(), vocab, hidden, x.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < hidden; ++j) EXPECT_EQ(x[i * hidden + j], table[ids[i] * hidden + j]);
  auto loss = [&] {
    embedding_forward(ids.data(), n, table.data(), vocab, hidden, x.data());
    return dot(x, r);
  };
  std::vector<double> dtable(vocab * hidden, 0.0);
  embedding_backward(ids.data(), n, r.data(), vocab, hidden, dtable.data());
  expect_gradient(table, dtable, loss, "dtable");
  for (int64_t j = 0; j < hidden; ++j) EXPECT_EQ(dtable[2 * hidden + j], 0.0);  // id 2 never appears
}

TEST(Embedding, RejectsIdsOutsideTheVocabulary) {
  std::vector<int32_t> ids{0, 6};
  std::vector<float> table(6 * 2), x(4);
  try {
    embedding_forward(ids.data(), 2, table.data(), 6, 2, x.data());
    FAIL() << "no exception";
  } catch (const zero3::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids[1] = 6"), std::string::npos) << e.what();
  }
}

TEST(RmsNorm, ForwardIsHuggingFaceFormula) {
  const int64_t rows = 3, n = 12;
  auto x = random_vector<double>(rows * n, 30), w = random_vector<double>(n, 31);
  std::vector<double> y(rows * n), rstd(rows);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, n, 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < n; ++i) ms += x[r * n + i] * x[r * n + i];
    ms /= n;
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[r * n + i], w[i] * x[r * n + i] / std::sqrt(ms + 1e-5), 1e-14);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 5, n = 12;
  auto x = random_vector<double>(rows * n, 32), w = random_vector<double>(n, 33),
       r = random_vector<double>(rows * n, 34);
  const double eps = 1e-5;
  auto loss = [&] {
    std::vector<double> y(rows * n);
    rmsnorm_forward(x.data(), w.data(), y.data(), static_cast<double*>(nullptr), rows, n, eps);
    return dot(y, r);
  };
  std::vector<double> y(rows * n), rstd(rows), dx(rows * n), dw(n, 0.0);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, n, eps);
  rmsnorm_backward(x.data(), w.data(), rstd.data(), r.data(), dx.data(), dw.data(), rows, n, false);
  expect_gradient(x, dx, loss, "dx");
  expect_gradient(w, dw, loss, "dw");
}

TEST(Rope, InverseFrequenciesFollowTheConfig) {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.head_dim = 16;
  c.rope_theta = 500000;
  auto inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 8u);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv[i], std::pow(500000.0, -2.0 * i / 16), 1e-6 * inv[i]);

  // Llama-3.1 scaling on the 8B head (head_dim 128): short wavelengths kept, long ones divided by 8, the band
  // between interpolated (checked here in double against the published rule).
  c.head_dim = 128;
  c.rope_scaling = RopeScaling{8.0, 1.0, 4.0, 8192};
  auto scaled = rope_inv_freq(c);
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    double f = std::pow(500000.0, -2.0 * i / 128), wavelen = 2 * M_PI / f, want;
    if (wavelen < 8192.0 / 4) {
      want = f;
      ++kept;
    } else if (wavelen > 8192.0) {
      want = f / 8;
      ++divided;
    } else {
      double s = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - s) * f / 8 + s * f;
      ++smoothed;
    }
    EXPECT_NEAR(scaled[i], want, 2e-6 * want) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(Rope, PositionZeroIsIdentityAndRotationPreservesNorm) {
  std::vector<float> inv{1.0f, 0.1f, 0.01f};
  std::vector<int32_t> pos{0, 3};
  auto t = make_rope_table<double>(inv, pos.data(), 2);
  auto x = random_vector<double>(2 * 6, 40);
  auto y = x;
  rope_forward(y.data(), 6, 1, 6, t);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], x[i]);
  double n0 = 0, n1 = 0;
  for (int i = 6; i < 12; ++i) n0 += x[i] * x[i], n1 += y[i] * y[i];
  EXPECT_NEAR(n0, n1, 1e-14);
  // rotate_half: out_0 = x_0 cos(3) - x_3 sin(3)
  EXPECT_NEAR(y[6], x[6] * std::cos(3.0) - x[9] * std::sin(3.0), 1e-15);
  EXPECT_NEAR(y[9], x[9] * std::cos(3.0) + x[6] * std::sin(3.0), 1e-15);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  // 5 tokens, 3 heads of 4 inside rows of stride 14 (a column block of a wider buffer).
  const int64_t n = 5, heads = 3, hd = 4, ld = 14;
  std::vector<float> inv{1.0f, 0.05f};
  std::vector<int32_t> pos{0, 1, 2, 7, 11};
  auto t = make_rope_table<double>(inv, pos.data(), n);
  auto x = random_vector<double>(n * ld, 41), r = random_vector<double>(n * ld, 42);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = heads * hd; j < ld; ++j) r[i * ld + j] = 0;  // columns outside the heads are untouched
  auto loss = [&] {
    auto y = x;
    rope_forward(y.data(), ld, heads, hd, t);
    return dot(y, r);
  };
  auto dx = r;
  rope_backward(dx.data(), ld, heads, hd, t);
  expect_gradient(x, dx, loss, "dx");
}

TEST(Softmax, CausalRowAndBackward) {
  const int64_t len = 6, valid = 4;
  auto x = random_vector<double>(len, 50, 3.0), r = random_vector<double>(len, 51);
  auto p = x;
  double lse = causal_softmax_row(p.data(), len, valid);
  double sum = 0, direct = 0;
  for (int64_t s = 0; s < valid; ++s) sum += p[s], direct += std::exp(x[s]);
  EXPECT_NEAR(sum, 1.0, 1e-15);
  EXPECT_NEAR(lse, std::log(direct), 1e-14);
  EXPECT_EQ(p[4], 0.0);
  EXPECT_EQ(p[5], 0.0);
  auto again = x;
  causal_softmax_from_lse_row(again.data(), len, valid, lse);
  for (int64_t s = 0; s < len; ++s) EXPECT_NEAR(again[s], p[s], 1e-15);
  auto loss = [&] {
    auto q = x;
    causal_softmax_row(q.data(), len, valid);
    return dot(q, r);
  };
  auto dx = r;
  softmax_backward_row(p.data(), dx.data(), len, valid);
  expect_gradient(x, dx, loss, "dx");
}

namespace {

// Attention straight from the definition, in double: separate q/k/v tensors, explicit causal loops.
std::vector<double> naive_attention(const AttentionShape& s, const std::vector<double>& q, int64_t ldq,
                                    const std::vector<double>& k, int64_t ldk, const std::vector<double>& v,
                                    int64_t ldv) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  std::vector<double> out(s.batch * s.seq * s.n_heads * hd, 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.n_heads; ++h)
      for (int64_t t = 0; t < s.seq; ++t) {
        std::vector<double> w(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += q[(b * s.seq + t) * ldq + h * hd + i] * k[(b * s.seq + u) * ldk + (h / group) * hd + i];
          w[u] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, w[u]);
        }
        for (auto& e : w) sum += (e = std::exp(e - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t i = 0; i < hd; ++i)
            out[(b * s.seq + t) * s.n_heads * hd + h * hd + i] +=
                w[u] / sum * v[(b * s.seq + u) * ldv + (h / group) * hd + i];
      }
  return out;
}

void check_attention(const AttentionShape& s, uint64_t seed) {
  const int64_t n = s.batch * s.seq, qd = s.n_heads * s.head_dim, kd = s.n_kv_heads * s.head_dim;
  // q, k, v as column blocks of one fused row, as the model stores them.
  const int64_t ld = qd + 2 * kd;
  auto qkv = random_vector<double>(n * ld, seed, 1.5), r = random_vector<double>(n * qd, seed + 1);
  auto run = [&](std::vector<double>& lse) {
    AttentionIO<double> io{qkv.data(), ld, qkv.data() + qd, ld, qkv.data() + qd + kd, ld};
    std::vector<double> out(n * qd);
    attention_forward(s, io, out.data(), qd, lse.data());
    return out;
  };
  std::vector<double> lse(s.batch * s.n_heads * s.seq);
  auto out = run(lse);
  // forward against the definition
  auto want = naive_attention(s, qkv, ld, std::vector<double>(qkv.begin() + qd, qkv.end()), ld,
                              std::vector<double>(qkv.begin() + qd + kd, qkv.end()), ld);
  EXPECT_LT(max_rel_diff(out.data(), want.data(), want.size()), 1e-13);
  auto loss = [&] {
    std::vector<double> l(lse.size());
    return dot(run(l), r);
  };
  std::vector<double> dqkv(n * ld, 7.0);
  AttentionIO<double> io{qkv.data(), ld, qkv.data() + qd, ld, qkv.data() + qd + kd, ld};
  attention_backward(s, io, lse.data(), r.data(), qd, dqkv.data(), ld, dqkv.data() + qd, ld, dqkv.data() + qd + kd, ld);
  expect_gradient(qkv, dqkv, loss, "dqkv");
}

}  // namespace

TEST(Attention, GroupedQueryOddShapes) {
  check_attention({2, 5, 3, 1, 4}, 60);  // 3 query heads share one kv head
  check_attention({1, 7, 4, 2, 6}, 61);  // groups of two
  check_attention({2, 3, 2, 2, 2}, 62);  // plain multi-head
  check_attention({1, 1, 2, 1, 4}, 63);  // a single token sees only itself
}

TEST(Attention, RejectsHeadsNotDivisibleByKvHeads) {
  AttentionShape s{1, 2, 3, 2, 4};
  std::vector<float> buf(64), lse(6);
  AttentionIO<float> io{buf.data(), 4, buf.data(), 4, buf.data(), 4};
  EXPECT_THROW(attention_forward(s, io, buf.data(), 4, lse.data()), zero3::InvalidArgument);
}

TEST(SwiGlu, ForwardAndBackward) {
  const int64_t rows = 3, inter = 5;
  auto gu = random_vector<double>(rows * 2 * inter, 70, 4.0), r = random_vector<double>(rows * inter, 71);
  std::vector<double> h(rows * inter);
  swiglu_forward(gu.data(), h.data(), rows, inter);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < inter; ++j) {
      double g = gu[i * 2 * inter + j], u = gu[i * 2 * inter + inter + j];
      EXPECT_NEAR(h[i * inter + j], g / (1 + std::exp(-g)) * u, 1e-14);
    }
  auto loss = [&] {
    swiglu_forward(gu.data(), h.data(), rows, inter);
    return dot(h, r);
  };
  std::vector<double> dgu(rows * 2 * inter);
  swiglu_backward(gu.data(), r.data(), dgu.data(), rows, inter);
  expect_gradient(gu, dgu, loss, "dgu");
}

TEST(CrossEntropy, LossIsMeanOverNonIgnoredTokensAndBackwardMatches) {
  const int64_t n = 7, hidden = 6, vocab = 11;
  auto x = random_vector<double>(n * hidden, 80), w = random_vector<double>(vocab * hidden, 81);
  std::vector<int32_t> targets{3, kIgnoreIndex, 0, 10, kIgnoreIndex, 5, 5};
  // direct: loss of each row from explicit logits
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] == kIgnoreIndex) continue;
    std::vector<double> logit(vocab);
    double mx = -1e300, sum = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t j = 0; j < hidden; ++j) logit[v] += x[i * hidden + j] * w[v * hidden + j];
      mx = std::max(mx, logit[v]);
    }
    for (double l : logit) sum += std::exp(l - mx);
    want += mx + std::log(sum) - logit[targets[i]];
  }
  auto r0 =
      lm_head_cross_entropy<double>(x.data(), w.data(), targets.data(), n, hidden, vocab, 0.0, nullptr, nullptr, 0);
  EXPECT_EQ(r0.count, 5);
  EXPECT_NEAR(r0.loss_sum, want, 1e-12);

  auto loss = [&] {
    return lm_head_cross_entropy<double>(x.data(), w.data(), targets.data(), n, hidden, vocab, 0.0, nullptr, nullptr, 0)
               .loss_sum /
           5.0;
  };
  for (int64_t chunk : {0, 1, 3, 100}) {
    std::vector<double> dx(n * hidden, 5.0), dw(vocab * hidden, 0.0);
    auto r = lm_head_cross_entropy<double>(x.data(), w.data(), targets.data(), n, hidden, vocab, 1.0 / 5, dx.data(),
                                           dw.data(), chunk);
    EXPECT_NEAR(r.loss_sum, want, 1e-12) << chunk;
    expect_gradient(x, dx, loss, "dx chunk " + std::to_string(chunk));
    expect_gradient(w, dw, loss, "dw chunk " + std::to_string(chunk));
    // ignored rows get no gradient
    for (int64_t j = 0; j < hidden; ++j) EXPECT_EQ(dx[1 * hidden + j], 0.0);
  }
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  std::vector<int32_t> t{0, -1};
  EXPECT_THROW(count_targets(t.data(), 2, 4), zero3::InvalidArgument);
  t[1] = 4;
  EXPECT_THROW(count_targets(t.data(), 2, 4), zero3::InvalidArgument);
  t[1] = kIgnoreIndex;
  EXPECT_EQ(count_targets(t.data(), 2, 4), 1);
}

TEST(CrossEntropy, AccurateAtLlama3VocabularyAgainstDouble) {
  // Llama-3's vocabulary (128,256): each row's loss and every gradient element within 1e-6 relative of a
  // compensated double reference. The rows are ones a float sum of exponentials taken one term after another
  // gets wrong by more than that (checked below, so the test can fail).
  using llama3::testing::cross_entropy_reference;
  using llama3::testing::max_elementwise_rel;
  const auto c = llama3::testing::llm_like_rows(llama3::testing::kLlama3Vocab, 2024);
  const float scale = 1.0f / 3;  // the op's grad_scale is a float: the reference scales by the same value
  const auto ref = cross_entropy_reference(c, scale);
  double worst_loss = 0, worst_grad = 0, naive_loss = 0, naive_grad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<float> row(c.logits.begin() + r * c.vocab, c.logits.begin() + (r + 1) * c.vocab);
    const float* x = c.logits.data() + r * c.vocab;
    const double want = ref.loss[r];
    const double loss = cross_entropy_row<float>(row.data(), c.vocab, c.targets[r], scale, true);
    const double loss_err = want == 0 ? std::fabs(loss) : std::fabs(loss - want) / want;
    const double grad_err = max_elementwise_rel(row.data(), ref.grad.data() + r * c.vocab, c.vocab);
    EXPECT_LE(loss_err, 1e-6) << c.kinds[r] << ": loss " << loss << " vs " << want;
    EXPECT_LE(grad_err, 1e-6) << c.kinds[r];
    worst_loss = std::max(worst_loss, loss_err);
    worst_grad = std::max(worst_grad, grad_err);
    if (c.targets[r] == kIgnoreIndex) continue;
    // The float sum one term after another, as this op computed it before.
    float mx = *std::max_element(x, x + c.vocab), sum = 0;
    for (int64_t j = 0; j < c.vocab; ++j) sum += std::exp(x[j] - mx);
    const float naive = std::log(sum) - (x[c.targets[r]] - mx);
    naive_loss = std::max(naive_loss, std::fabs(naive - want) / want);
    std::vector<float> g(static_cast<size_t>(c.vocab));
    for (int64_t j = 0; j < c.vocab; ++j) g[j] = std::exp(x[j] - mx) * (scale / sum);
    g[c.targets[r]] -= scale;
    naive_grad = std::max(naive_grad, max_elementwise_rel(g.data(), ref.grad.data() + r * c.vocab, c.vocab));
    std::printf("%-12s loss %.9g: rel error %.2g (float sum one term after another: %.2g)\n", c.kinds[r].c_str(), want,
                loss_err, std::fabs(naive - want) / want);
  }
  std::printf(
      "vocabulary %lld: worst loss error %.2g, worst gradient element error %.2g relative; a float sum one "
      "term after another: %.2g and %.2g\n",
      static_cast<long long>(c.vocab), worst_loss, worst_grad, naive_loss, naive_grad);
  EXPECT_GT(naive_loss, 1e-6);
  EXPECT_GT(naive_grad, 1e-6);
}

TEST(CrossEntropy, FusedLmHeadAtLlama3VocabularyAgainstDouble) {
  // The fused op (LM head GEMMs + cross-entropy) in float against the same op in double on the same inputs: the
  // loss within 1e-6 relative; dx and dW, which the LM head's GEMMs reduce over the vocabulary and the rows in
  // float (OpenBLAS, as PyTorch's CPU kernels do; unbiased rounding), within 1e-5 (dx of its row's largest, dW of
  // the tensor's largest). hidden 8, 8 rows, 3 of them ignored. (The rows of the test above are the ones that
  // expose a float sum of exponentials; these check the fused path and its GEMMs at this vocabulary.)
  const int64_t n = 8, hidden = 8, vocab = llama3::testing::kLlama3Vocab;
  auto xf = random_vector<float>(n * hidden, 90, 4.0), wf = random_vector<float>(vocab * hidden, 91, 1.0);
  const std::vector<double> xd(xf.begin(), xf.end()), wd(wf.begin(), wf.end());
  // Targets among each row's most likely tokens (the k-th largest logit, k = 0, 1, 2, 4, 8), so the losses are a
  // trained model's and the small terms of the sums matter.
  std::vector<int32_t> targets(static_cast<size_t>(n), kIgnoreIndex);
  const int64_t rank_of[n] = {0, -1, 1, 2, -1, 4, 8, -1};
  for (int64_t r = 0; r < n; ++r) {
    if (rank_of[r] < 0) continue;
    std::vector<std::pair<double, int32_t>> logit(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) {
      double l = 0;
      for (int64_t k = 0; k < hidden; ++k) l += xd[r * hidden + k] * wd[v * hidden + k];
      logit[v] = {l, static_cast<int32_t>(v)};
    }
    std::nth_element(logit.begin(), logit.begin() + rank_of[r], logit.end(), std::greater<>());
    targets[r] = logit[rank_of[r]].second;
  }
  std::vector<float> dxf(n * hidden), dwf(vocab * hidden, 0.0f);
  std::vector<double> dxd(n * hidden), dwd(vocab * hidden, 0.0);
  const float scale = 1.0f / 5;
  const auto rf = lm_head_cross_entropy<float>(xf.data(), wf.data(), targets.data(), n, hidden, vocab, scale,
                                               dxf.data(), dwf.data(), 3);
  const auto rd = lm_head_cross_entropy<double>(xd.data(), wd.data(), targets.data(), n, hidden, vocab, scale,
                                                dxd.data(), dwd.data(), 3);
  EXPECT_EQ(rf.count, 5);
  const double loss_err = std::fabs(rf.loss_sum - rd.loss_sum) / rd.loss_sum;
  double dx_err = 0;
  for (int64_t r = 0; r < n; ++r)
    dx_err = std::max(dx_err, max_rel_diff(dxf.data() + r * hidden, dxd.data() + r * hidden, hidden, 1e-300));
  const double dw_err = max_rel_diff(dwf.data(), dwd.data(), dwf.size());
  std::printf("fused LM head + cross-entropy at vocabulary %lld, float vs double: loss %.2g, dx %.2g, dW %.2g\n",
              static_cast<long long>(vocab), loss_err, dx_err, dw_err);
  EXPECT_LE(loss_err, 1e-6);
  EXPECT_LE(dx_err, 1e-5);
  EXPECT_LE(dw_err, 1e-5);
}

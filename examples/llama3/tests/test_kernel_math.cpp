// The element and row arithmetic the CUDA kernels share with the CPU ops (kernel_math/), run on the host the way
// the kernels run it: RMSNorm, RoPE, SwiGLU and the embedding here (the cross-entropy and the attention rows:
// test_kernel_math_rows.cpp). Each test walks the kernel's index space (its 16-byte packs and its scalar form),
// reduces rows in the kernel's order (cuda_block_order.hpp) and rounds to bf16 where the kernel stores bf16, then
// compares with the CPU op of ops/ at odd sizes: in f32 against the op in float and in double, in bf16 against the
// op in double on the same bf16 inputs. The GPU run then tests launches and memory, not this arithmetic.
//
// Bounds (of each tensor's largest magnitude): f32 1e-6 where no row is reduced (RoPE, SwiGLU; and bit for bit
// against the float op), 1e-5 for RMSNorm (sums of up to 4096 terms in another order; measured 2.4e-7); bf16 one
// rounding of each output, at most 2^-8 of it: 4e-3 (measured 3.5e-3). The embedding is exact: both add each id's
// tokens in token order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cuda_block_order.hpp"
#include "grad_check.hpp"
#include "kernel_math/embedding_math.hpp"
#include "kernel_math/rmsnorm_math.hpp"
#include "kernel_math/rope_math.hpp"
#include "kernel_math/swiglu_math.hpp"
#include "ops/embedding.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/rope.hpp"
#include "ops/swiglu.hpp"

using namespace llama3;
using namespace llama3::kernel_math;
using llama3::testing::block_sum;
using llama3::testing::for_thread_groups;
using llama3::testing::max_rel_diff;
using llama3::testing::random_vector;
using llama3::testing::round_bf16;

namespace {

constexpr double kF32Rows = 1e-5;      // f32, rows reduced in the kernel's order
constexpr double kF32Elements = 1e-6;  // f32, no reduction
constexpr double kBf16 = 4e-3;         // one bf16 rounding of each output: at most 2^-8 of it

// The kernels' element types: f32 as is, bf16 rounded on every store (and so on every load of a stored value).
enum class Act { f32, bf16 };
const char* name(Act a) { return a == Act::f32 ? "f32" : "bf16"; }
float stored(float v, Act a) { return a == Act::f32 ? v : round_bf16(v); }
int pack(Act a) { return a == Act::f32 ? 4 : 8; }  // 16 bytes of the type

std::vector<float> activations(size_t n, uint64_t seed, double scale, Act a) {
  auto v = random_vector<float>(n, seed, scale);
  for (float& x : v) x = stored(x, a);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The widths a kernel may take for a row of n: its 16-byte pack when it divides n, and 1.
std::vector<int64_t> widths(int64_t n, Act a) {
  if (n % pack(a) == 0) return {pack(a), 1};
  return {1};
}

// ---- RMSNorm: norm_kernels.cu's three kernels. ----

constexpr int kRowThreads = 256, kDwLanes = 8;
constexpr int64_t kDwChunkRows = 128;

// rmsnorm_forward_kernel (no fused add): y and rstd of every row.
void norm_forward_like_cuda(const std::vector<float>& x, const std::vector<float>& w, std::vector<float>& y,
                            std::vector<float>& rstd, int64_t rows, int64_t n, float eps, int64_t width, Act a) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * n;
    std::vector<float> ss(kRowThreads, 0.0f);
    for_thread_groups(kRowThreads, n, width, [&](int t, int64_t i0) {
      for (int64_t k = 0; k < width; ++k) ss[t] += rmsnorm_square(xr[i0 + k]);
    });
    const float s = rmsnorm_rstd(block_sum(ss), n, eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = stored(rmsnorm_output(xr[i], w[i], s), a);
    rstd[r] = s;
  }
}

// rmsnorm_backward_dx_kernel with a residual, then the two dw kernels (partials per chunk of rows and lane of
// kDwLanes rows, lanes in order, chunks in order).
void norm_backward_like_cuda(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& rstd,
                             const std::vector<float>& dy, const std::vector<float>& residual, std::vector<float>& dx,
                             std::vector<float>& dw, int64_t rows, int64_t n, int64_t width, Act a) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * n;
    std::vector<float> dot(kRowThreads, 0.0f);
    for_thread_groups(kRowThreads, n, width, [&](int t, int64_t i0) {
      for (int64_t k = 0; k < width; ++k) dot[t] += rmsnorm_dot_term(x[o + i0 + k], w[i0 + k], dy[o + i0 + k], rstd[r]);
    });
    const float mean = rmsnorm_dot_mean(block_sum(dot), n);
    for (int64_t i = 0; i < n; ++i) {
      dx[o + i] = stored(residual[o + i] + rmsnorm_input_grad(x[o + i], w[i], dy[o + i], rstd[r], mean), a);
    }
  }
  const int64_t chunks = (rows + kDwChunkRows - 1) / kDwChunkRows;
  for (int64_t col = 0; col < n; ++col) {
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * kDwChunkRows, r1 = std::min(rows, r0 + kDwChunkRows);
      float lanes = 0.0f;
      for (int lane = 0; lane < kDwLanes; ++lane) {
        float s = 0.0f;
        for (int64_t r = r0 + lane; r < r1; r += kDwLanes)
          s += rmsnorm_weight_grad_term(x[r * n + col], dy[r * n + col], rstd[r]);
        lanes += s;
      }
      total += lanes;
    }
    dw[col] += total;
  }
}

TEST(KernelMath, RmsNormForwardAndBackwardInTheKernelsOrder) {
  const float eps = 1e-5f;
  double worst[2] = {0, 0};  // f32, bf16: the largest error against the op in double
  for (Act a : {Act::f32, Act::bf16}) {
    for (int64_t n : {1, 7, 20, 1003, 4096}) {
      const int64_t rows = n > 1000 ? 131 : 9;  // 131 rows: two dw chunks, the last short
      for (int64_t width : widths(n, a)) {
        SCOPED_TRACE(std::string(name(a)) + ", n " + std::to_string(n) + ", width " + std::to_string(width));
        const auto x = activations(rows * n, 11 + n, 2.0, a), w = activations(n, 12 + n, 1.5, a);
        const auto dy = activations(rows * n, 13 + n, 1.0, a), res = activations(rows * n, 14 + n, 1.0, a);
        std::vector<float> y(rows * n), rstd(rows), dx(rows * n), dw(n, 0.25f);
        norm_forward_like_cuda(x, w, y, rstd, rows, n, eps, width, a);
        norm_backward_like_cuda(x, w, rstd, dy, res, dx, dw, rows, n, width, a);

        // The CPU op in double on the same (bf16-rounded) inputs; dx with the residual added, dw accumulated.
        const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
        std::vector<double> yd(rows * n), rd(rows), dxd = to_double(res), dwd(n, 0.25);
        rmsnorm_forward<double>(xd.data(), wd.data(), yd.data(), rd.data(), rows, n, eps);
        rmsnorm_backward<double>(xd.data(), wd.data(), rd.data(), dyd.data(), dxd.data(), dwd.data(), rows, n, true);
        const double bound = a == Act::f32 ? kF32Rows : kBf16;
        const double e_y = max_rel_diff(y.data(), yd.data(), y.size()),
                     e_dx = max_rel_diff(dx.data(), dxd.data(), dx.size());
        const double e_rstd = max_rel_diff(rstd.data(), rd.data(), rstd.size());
        const double e_dw = max_rel_diff(dw.data(), dwd.data(), dw.size());
        EXPECT_LE(e_y, bound);
        EXPECT_LE(e_rstd, kF32Rows);  // rstd is f32 in both types
        EXPECT_LE(e_dx, bound);
        EXPECT_LE(e_dw, kF32Rows);  // dw is f32 in both types
        worst[a == Act::bf16] = std::max({worst[a == Act::bf16], e_y, e_dx, e_rstd, e_dw});
        if (a == Act::f32) {  // and the CPU op in float, which adds the same terms in element order
          std::vector<float> yf(rows * n), rf(rows), dxf = res, dwf(n, 0.25f);
          rmsnorm_forward<float>(x.data(), w.data(), yf.data(), rf.data(), rows, n, eps);
          rmsnorm_backward<float>(x.data(), w.data(), rf.data(), dy.data(), dxf.data(), dwf.data(), rows, n, true);
          EXPECT_LE(max_rel_diff(y.data(), yf.data(), y.size()), kF32Rows);
          EXPECT_LE(max_rel_diff(dx.data(), dxf.data(), dx.size()), kF32Rows);
          EXPECT_LE(max_rel_diff(dw.data(), dwf.data(), dw.size()), kF32Rows);
        }
      }
    }
  }
  std::printf("RMSNorm in the kernels' order against the CPU op in double: worst %.2g (f32), %.2g (bf16)\n", worst[0],
              worst[1]);
}

// ---- RoPE: rope_kernel over the q and k heads of strided rows (the v heads and the padding untouched). ----

void rope_like_cuda(std::vector<float>& x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                    const std::vector<float>& cos, const std::vector<float>& sin, int64_t width, bool backward, Act a,
                    std::vector<int>& visits) {
  const int64_t half = head_dim / 2;
  const RopeItems items = rope_items(n_tokens, n_heads, half, width);
  for (int64_t idx = 0; idx < items.total; ++idx) {
    const RopeItem it = rope_item(items, idx);
    float* xh = x.data() + it.token * ld + it.head * head_dim;
    for (int64_t k = 0; k < width; ++k) {
      const int64_t i = it.i + k, c = it.token * half + i;
      const RotatedPair<float> p = backward ? rope_rotate_back(xh[i], xh[i + half], cos[c], sin[c])
                                            : rope_rotate(xh[i], xh[i + half], cos[c], sin[c]);
      xh[i] = stored(p.lo, a);
      xh[i + half] = stored(p.hi, a);
      ++visits[(it.token * n_heads + it.head) * half + i];
    }
  }
}

TEST(KernelMath, RopeOverQAndKHeadsInTheKernelsIndexSpace) {
  const int64_t n_tokens = 7, q_heads = 8, kv_heads = 2;  // GQA: 8 query heads over 2 kv heads
  const int64_t n_heads = q_heads + kv_heads;             // q and k heads in one launch
  for (Act a : {Act::f32, Act::bf16}) {
    for (int64_t head_dim : {12, 16, 128}) {
      const int64_t half = head_dim / 2;
      const int64_t ld = (q_heads + 2 * kv_heads) * head_dim + 8;  // q | k | v | padding
      for (int64_t width : widths(half, a)) {
        if (ld % width != 0) continue;  // the kernel's vector form needs the row stride in whole packs too
        SCOPED_TRACE(std::string(name(a)) + ", head_dim " + std::to_string(head_dim) + ", width " +
                     std::to_string(width));
        RopeTable<float> table;
        table.n_tokens = n_tokens;
        table.half = half;
        const auto angle = random_vector<double>(n_tokens * half, 21 + head_dim, 40.0);
        for (double t : angle) {
          table.cos.push_back(static_cast<float>(std::cos(t)));
          table.sin.push_back(static_cast<float>(std::sin(t)));
        }
        const auto x0 = activations(n_tokens * ld, 22 + head_dim, 3.0, a);
        for (bool backward : {false, true}) {
          auto x = x0;
          std::vector<int> visits(n_tokens * n_heads * half, 0);
          rope_like_cuda(x, ld, n_tokens, n_heads, head_dim, table.cos, table.sin, width, backward, a, visits);
          EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }))
              << "the kernel's items must cover every (token, head, pair) once";
          for (int64_t r = 0; r < n_tokens; ++r)  // the v heads and the padding untouched
            for (int64_t c = n_heads * head_dim; c < ld; ++c) ASSERT_EQ(x[r * ld + c], x0[r * ld + c]);
          RopeTable<double> td{
              n_tokens, half, {table.cos.begin(), table.cos.end()}, {table.sin.begin(), table.sin.end()}};
          auto xd = to_double(x0);
          if (backward) {
            rope_backward<double>(xd.data(), ld, n_heads, head_dim, td);
          } else {
            rope_forward<double>(xd.data(), ld, n_heads, head_dim, td);
          }
          EXPECT_LE(max_rel_diff(x.data(), xd.data(), x.size()), a == Act::f32 ? kF32Elements : kBf16);
          if (a == Act::f32) {  // the same products and sums as the float op: the same bits
            auto xf = x0;
            if (backward) {
              rope_backward<float>(xf.data(), ld, n_heads, head_dim, table);
            } else {
              rope_forward<float>(xf.data(), ld, n_heads, head_dim, table);
            }
            EXPECT_EQ(x, xf);
          }
        }
      }
    }
  }
}

// ---- SwiGLU: swiglu_forward_kernel and swiglu_backward_kernel over rows of gate | up. ----

TEST(KernelMath, SwigluForwardAndBackwardInTheKernelsIndexSpace) {
  const int64_t rows = 7;
  for (Act a : {Act::f32, Act::bf16}) {
    for (int64_t inter : {20, 40, 96, 101}) {
      for (int64_t width : widths(inter, a)) {
        SCOPED_TRACE(std::string(name(a)) + ", inter " + std::to_string(inter) + ", width " + std::to_string(width));
        const auto gu = activations(rows * 2 * inter, 31 + inter, 4.0, a), dh = activations(rows * inter, 32, 1.0, a);
        std::vector<float> h(rows * inter, NAN), dgu(rows * 2 * inter, NAN);
        std::vector<int> visits(rows * inter, 0);
        for (int64_t idx = 0; idx < rows * (inter / width); ++idx) {
          const SwigluItem it = swiglu_item(idx, inter, width);
          for (int64_t k = 0; k < width; ++k) {
            const int64_t i = it.i + k;
            const float g = gu[it.row * 2 * inter + i], u = gu[it.row * 2 * inter + inter + i];
            h[it.row * inter + i] = stored(swiglu_forward_elem(g, u), a);
            const SwigluGrad<float> d = swiglu_backward_elem(g, u, dh[it.row * inter + i]);
            dgu[it.row * 2 * inter + i] = stored(d.dg, a);
            dgu[it.row * 2 * inter + inter + i] = stored(d.du, a);
            ++visits[it.row * inter + i];
          }
        }
        EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
        const auto gud = to_double(gu), dhd = to_double(dh);
        std::vector<double> hd(rows * inter), dgud(rows * 2 * inter);
        swiglu_forward<double>(gud.data(), hd.data(), rows, inter);
        swiglu_backward<double>(gud.data(), dhd.data(), dgud.data(), rows, inter);
        const double bound = a == Act::f32 ? kF32Elements : kBf16;
        EXPECT_LE(max_rel_diff(h.data(), hd.data(), h.size()), bound);
        EXPECT_LE(max_rel_diff(dgu.data(), dgud.data(), dgu.size()), bound);
        if (a == Act::f32) {
          std::vector<float> hf(rows * inter), dguf(rows * 2 * inter);
          swiglu_forward<float>(gu.data(), hf.data(), rows, inter);
          swiglu_backward<float>(gu.data(), dh.data(), dguf.data(), rows, inter);
          EXPECT_EQ(h, hf);
          EXPECT_EQ(dgu, dguf);
        }
      }
    }
  }
}

// ---- Embedding: the forward's gather and the backward's per-id column sums (embedding.cu). ----

TEST(KernelMath, EmbeddingGatherAndGroupedBackwardAreTheCpuBits) {
  const int64_t vocab = 50, tokens = 37, hidden = 19;
  std::vector<int32_t> ids(tokens);
  for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 7 + i / 3) % 11);  // repeats, unsorted
  ids[5] = static_cast<int32_t>(vocab - 1);
  for (Act a : {Act::f32, Act::bf16}) {
    SCOPED_TRACE(name(a));
    const auto table = activations(vocab * hidden, 41, 1.0, a), dx = activations(tokens * hidden, 42, 1.0, a);
    std::vector<float> x(tokens * hidden);
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t j = 0; j < hidden; ++j) x[i * hidden + j] = table[embedding_source(ids.data(), i, j, hidden)];
    std::vector<float> xf(tokens * hidden);
    embedding_forward<float>(ids.data(), tokens, table.data(), vocab, hidden, xf.data());
    EXPECT_EQ(x, xf);

    // The kernel's grouping (cuda/embedding_grouping.cpp): distinct ids, each with its tokens in increasing order.
    std::vector<int32_t> order(tokens);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t p, int32_t q) { return ids[p] < ids[q]; });
    std::vector<float> dtable(vocab * hidden, 0.5f);  // accumulates onto what is there (f32 in both types)
    for (int64_t t0 = 0; t0 < tokens;) {
      int64_t t1 = t0;
      while (t1 < tokens && ids[order[t1]] == ids[order[t0]]) ++t1;
      float* drow = dtable.data() + static_cast<int64_t>(ids[order[t0]]) * hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        drow[j] = embedding_grad_column(drow[j], dx.data(), order.data(), static_cast<int32_t>(t0),
                                        static_cast<int32_t>(t1), hidden, j);
      }
      t0 = t1;
    }
    std::vector<float> dtable_cpu(vocab * hidden, 0.5f);
    embedding_backward<float>(ids.data(), tokens, dx.data(), vocab, hidden, dtable_cpu.data());
    EXPECT_EQ(dtable, dtable_cpu);
  }
}

}  // namespace

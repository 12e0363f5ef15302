#include "ops/attention.hpp"

#include <string>
#include <vector>

#include "kernel_math/attention_math.hpp"
#include "ops/gemm.hpp"
#include "ops/parallel.hpp"
#include "ops/softmax.hpp"
#include "zero3/error.hpp"

namespace llama3 {

void check_attention_shape(const AttentionShape& s) {
  if (s.batch <= 0 || s.seq <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0) {
    throw zero3::InvalidArgument("attention: batch " + std::to_string(s.batch) + ", seq " + std::to_string(s.seq) +
                                 ", heads " + std::to_string(s.n_heads) + ", kv heads " + std::to_string(s.n_kv_heads) +
                                 ", head_dim " + std::to_string(s.head_dim) + ": all must be > 0");
  }
  if (s.n_heads % s.n_kv_heads != 0) {
    throw zero3::InvalidArgument("attention: n_kv_heads " + std::to_string(s.n_kv_heads) + " must divide n_heads " +
                                 std::to_string(s.n_heads));
  }
}

template <typename T>
void attention_forward(const AttentionShape& s, const AttentionIO<T>& in, T* out, int64_t ldo, T* lse) {
  check_attention_shape(s);
  using namespace kernel_math;
  const int64_t seq = s.seq, hd = s.head_dim, group = attention_group(s.n_heads, s.n_kv_heads);
  const T scale = attention_scale<T>(hd);
  std::vector<T> scores(static_cast<size_t>(seq * seq));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t g = attention_kv_head(h, group);
      const T* q = in.q + b * seq * in.ldq + h * hd;
      const T* k = in.k + b * seq * in.ldk + g * hd;
      const T* v = in.v + b * seq * in.ldv + g * hd;
      T* o = out + b * seq * ldo + h * hd;
      T* row_lse = lse + attention_lse_index(b, h, 0, s.n_heads, seq);
      gemm<T>(false, true, seq, seq, hd, scale, q, in.ldq, k, in.ldk, T(0), scores.data(), seq);
#pragma omp parallel for schedule(static) if (seq * seq >= kParallelMinWork)
      for (int64_t t = 0; t < seq; ++t)
        row_lse[t] = causal_softmax_row(scores.data() + t * seq, seq, causal_visible_keys(t));
      gemm<T>(false, false, seq, hd, seq, T(1), scores.data(), seq, v, in.ldv, T(0), o, ldo);
    }
  }
}

template <typename T>
void attention_backward(const AttentionShape& s, const AttentionIO<T>& in, const T* lse, const T* dout, int64_t lddo,
                        T* dq, int64_t lddq, T* dk, int64_t lddk, T* dv, int64_t lddv) {
  check_attention_shape(s);
  using namespace kernel_math;
  const int64_t seq = s.seq, hd = s.head_dim, group = attention_group(s.n_heads, s.n_kv_heads);
  const T scale = attention_scale<T>(hd);
  std::vector<T> p(static_cast<size_t>(seq * seq)), dp(static_cast<size_t>(seq * seq));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.n_kv_heads; ++g) {
      const T* k = in.k + b * seq * in.ldk + g * hd;
      const T* v = in.v + b * seq * in.ldv + g * hd;
      T* dkg = dk + b * seq * lddk + g * hd;
      T* dvg = dv + b * seq * lddv + g * hd;
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = attention_query_head(g, j, group);
        const T* q = in.q + b * seq * in.ldq + h * hd;
        const T* dout_h = dout + b * seq * lddo + h * hd;
        const T* row_lse = lse + attention_lse_index(b, h, 0, s.n_heads, seq);
        T* dqh = dq + b * seq * lddq + h * hd;
        // The first query head of the group overwrites dk/dv, the others add to them.
        const T beta_kv = j == 0 ? T(0) : T(1);
        gemm<T>(false, true, seq, seq, hd, scale, q, in.ldq, k, in.ldk, T(0), p.data(), seq);
#pragma omp parallel for schedule(static) if (seq * seq >= kParallelMinWork)
        for (int64_t t = 0; t < seq; ++t)
          causal_softmax_from_lse_row(p.data() + t * seq, seq, causal_visible_keys(t), row_lse[t]);
        // dV += P^T dO ; dP = dO V^T
        gemm<T>(true, false, seq, hd, seq, T(1), p.data(), seq, dout_h, lddo, beta_kv, dvg, lddv);
        gemm<T>(false, true, seq, seq, hd, T(1), dout_h, lddo, v, in.ldv, T(0), dp.data(), seq);
#pragma omp parallel for schedule(static) if (seq * seq >= kParallelMinWork)
        for (int64_t t = 0; t < seq; ++t)
          softmax_backward_row(p.data() + t * seq, dp.data() + t * seq, seq, causal_visible_keys(t));
        // dS = dp (scale folded into the GEMMs): dQ = scale dS K ; dK += scale dS^T Q
        gemm<T>(false, false, seq, hd, seq, scale, dp.data(), seq, k, in.ldk, T(0), dqh, lddq);
        gemm<T>(true, false, seq, hd, seq, scale, dp.data(), seq, q, in.ldq, beta_kv, dkg, lddk);
      }
    }
  }
}

template void attention_forward<float>(const AttentionShape&, const AttentionIO<float>&, float*, int64_t, float*);
template void attention_forward<double>(const AttentionShape&, const AttentionIO<double>&, double*, int64_t, double*);
template void attention_backward<float>(const AttentionShape&, const AttentionIO<float>&, const float*, const float*,
                                        int64_t, float*, int64_t, float*, int64_t, float*, int64_t);
template void attention_backward<double>(const AttentionShape&, const AttentionIO<double>&, const double*,
                                         const double*, int64_t, double*, int64_t, double*, int64_t, double*, int64_t);

}  // namespace llama3

// The attention graphs as data (sdpa_graph.hpp).
#include "sdpa_graph.hpp"

#include <utility>

#include "zero3/error.hpp"

namespace llama3::sdpa_graph {
namespace {

class Builder {
 public:
  int input(std::string name, int64_t uid, DataType type, Dims dims, Dims strides) {
    return add({std::move(name), uid, type, dims, strides, false, false, Reordering::none});
  }
  int scalar(std::string name, int64_t uid) {
    return add({std::move(name), uid, DataType::f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, Reordering::none});
  }
  int virt(std::string name, DataType type, Dims dims, Dims strides) {
    return add({std::move(name), next_virtual_++, type, dims, strides, true, false, Reordering::none});
  }
  Tensor& tensor(int i) { return g_.tensors[static_cast<size_t>(i)]; }

  void node(std::string name, Op op, Mode mode, int x, int b, int y, int t = -1, DataType compute = DataType::f32,
            int64_t axis = -1) {
    g_.nodes.push_back({std::move(name), op, mode, compute, axis, x, b, t, y});
  }
  void matmul(std::string name, int a, int b, int c) { node(std::move(name), Op::matmul, Mode::none, a, b, c); }
  void pointwise(std::string name, Mode mode, int x, int b, int y, int t = -1) {
    node(std::move(name), Op::pointwise, mode, x, b, y, t);
  }
  void reduction(std::string name, Mode mode, int x, int y) { node(std::move(name), Op::reduction, mode, x, -1, y); }
  void reshape(std::string name, int x, int y) { node(std::move(name), Op::reshape, Mode::none, x, -1, y); }

  // The frontend's causal mask of `scores` (top-left diagonal): int32 row and column indices, row >= column keeps
  // the score, the rest become `lowest`.
  int causal_mask(int scores, int lowest, const std::string& suffix) {
    const Tensor s = tensor(scores);
    const int row = virt("row_idx" + suffix, DataType::i32, s.dims, s.strides);
    const int col = virt("col_idx" + suffix, DataType::i32, s.dims, s.strides);
    const int keep = virt("causal_mask" + suffix, DataType::boolean, s.dims, s.strides);
    const int masked = virt("masked" + suffix, DataType::f32, s.dims, s.strides);
    node("gen_row_idx_causal", Op::pointwise, Mode::gen_index, scores, -1, row, -1, DataType::i32, 2);
    node("gen_col_idx_causal", Op::pointwise, Mode::gen_index, scores, -1, col, -1, DataType::i32, 3);
    node("row_greater_than_col", Op::pointwise, Mode::cmp_ge, row, col, keep, -1, DataType::boolean);
    pointwise("binary_select", Mode::binary_select, scores, lowest, masked, keep);
    return masked;
  }

  Graph take() { return std::move(g_); }

 private:
  int add(Tensor t) {
    g_.tensors.push_back(std::move(t));
    return static_cast<int>(g_.tensors.size()) - 1;
  }
  Graph g_;
  int64_t next_virtual_ = kVirtual;
};

// The operands both graphs share.
struct Operands {
  int q, kt, o, stats, scale, lowest;
};

Operands common_operands(Builder& g, const Shape& p) {
  const int64_t b = p.b, s = p.s, h = p.h, k = p.k, d = p.d;
  Operands x{};
  x.q = g.input("Q", kQ, DataType::bf16, {b, h, s, d}, {s * p.ldq, d, p.ldq, 1});
  x.kt = g.input("K^T", kK, DataType::bf16, {b, k, d, s}, {s * p.ldk, d, 1, p.ldk});
  x.o = g.input("O", kO, DataType::bf16, {b, h, s, d}, {s * p.ldo, d, p.ldo, 1});
  x.stats = g.input("Stats", kStats, DataType::f32, {b, h, s, 1}, {h * s, s, 1, 1});
  x.scale = g.scalar("attn_scale", kScale);
  x.lowest = g.scalar("lowest", kLowest);
  return x;
}

}  // namespace

int Graph::find(const std::string& wanted) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == wanted) return static_cast<int>(i);
  }
  throw zero3::InvalidArgument("sdpa_graph: no tensor named '" + wanted + "'");
}

Graph forward_graph(const Shape& p) {
  const int64_t b = p.b, s = p.s, h = p.h, k = p.k, d = p.d;
  const Dims scores{b, h, s, s}, scores_st{h * s * s, s * s, s, 1}, row{b, h, s, 1}, row_st{h * s, s, 1, 1};
  Builder g;
  const Operands x = common_operands(g, p);
  const int v = g.input("V", kV, DataType::bf16, {b, k, s, d}, {s * p.ldv, d, p.ldv, 1});
  const int s_raw = g.virt("S", DataType::f32, scores, scores_st);
  const int s_scaled = g.virt("S_scaled", DataType::f32, scores, scores_st);
  g.matmul("matmul_Q_KT", x.q, x.kt, s_raw);
  g.pointwise("mul_s_attn_scale", Mode::mul, s_raw, x.scale, s_scaled);
  const int masked = g.causal_mask(s_scaled, x.lowest, "");
  const int mx = g.virt("max", DataType::f32, row, row_st);
  const int centred = g.virt("S_minus_max", DataType::f32, scores, scores_st);
  const int e = g.virt("exp", DataType::f32, scores, scores_st);
  const int z = g.virt("sum_exp", DataType::f32, row, row_st);
  const int log_z = g.virt("log_sum_exp", DataType::f32, row, row_st);
  const int prob = g.virt("P", DataType::bf16, scores, scores_st);  // bf16: the second matmul's A
  g.reduction("reduce_max", Mode::max, masked, mx);
  g.pointwise("sub_max", Mode::sub, masked, mx, centred);
  g.pointwise("exp", Mode::exp, centred, -1, e);
  g.reduction("reduce_sum_exp", Mode::sum, e, z);
  g.pointwise("log", Mode::log, z, -1, log_z);
  g.pointwise("add_stats", Mode::add, mx, log_z, x.stats);
  g.pointwise("div_softmax", Mode::div, e, z, prob);
  g.matmul("matmul_P_V", prob, v, x.o);
  return g.take();
}

Graph backward_graph(const Shape& p) {
  const int64_t b = p.b, s = p.s, h = p.h, k = p.k, d = p.d;
  const bool grouped = h != k;
  const Dims scores{b, h, s, s}, scores_st{h * s * s, s * s, s, 1}, row{b, h, s, 1}, row_st{h * s, s, 1, 1};
  const Dims scores_t_st{h * s * s, s * s, 1, s};  // the same scores read transposed
  const Dims per_q_head{b, h, s, d}, per_q_head_st{h * s * d, s * d, d, 1};
  Builder g;
  const Operands x = common_operands(g, p);
  const int vt = g.input("V^T", kV, DataType::bf16, {b, k, d, s}, {s * p.ldv, d, 1, p.ldv});
  const int one = g.scalar("one", kOne);
  const int dout = g.input("dO", kDO, DataType::bf16, {b, h, s, d}, {s * p.lddo, d, p.lddo, 1});
  const int dq = g.input("dQ", kDQ, DataType::bf16, {b, h, s, d}, {s * p.lddq, d, p.lddq, 1});
  const int dk = g.input("dK", kDK, DataType::bf16, {b, k, s, d}, {s * p.lddk, d, p.lddk, 1});
  const int dv = g.input("dV", kDV, DataType::bf16, {b, k, s, d}, {s * p.lddv, d, p.lddv, 1});
  const int dq_acc = g.input("dQ_accum", kDQAcc, DataType::f32, per_q_head, per_q_head_st);
  g.tensor(dq_acc).reordering = Reordering::f16x16;

  // D = rowsum(dO * O) * 1 (the frontend's dropout-scale node, 1 without dropout)
  const int do_o = g.virt("dO_O", DataType::f32, per_q_head, {h * s * d, s * d, h * d, 1});
  const int do_o_sum = g.virt("dO_O_sum", DataType::f32, row, row_st);
  const int softmax_sum = g.virt("softmax_sum", DataType::f32, row, row_st);
  g.pointwise("mul_dO_O", Mode::mul, dout, x.o, do_o);
  g.reduction("reduce_dO_o", Mode::sum, do_o, do_o_sum);
  g.pointwise("scale_dropout_inv", Mode::mul, do_o_sum, one, softmax_sum);

  // P = exp(mask(scale * Q K^T) - Stats)
  const int s_raw = g.virt("S", DataType::f32, scores, scores_st);
  const int s_scaled = g.virt("S_scaled", DataType::f32, scores, scores_st);
  g.matmul("matmul_Q_KT", x.q, x.kt, s_raw);
  g.pointwise("mul_s_attn_scale", Mode::mul, s_raw, x.scale, s_scaled);
  const int masked = g.causal_mask(s_scaled, x.lowest, "");
  const int centred = g.virt("S_minus_stats", DataType::f32, scores, scores_st);
  const int prob = g.virt("exp_s", DataType::f32, scores, scores_st);
  g.pointwise("sub_s_m", Mode::sub, masked, x.stats, centred);
  g.pointwise("exp_s", Mode::exp, centred, -1, prob);

  // dV = sum over the group of P^T dO
  const int p_t = g.virt("P^T", DataType::bf16, scores, scores_t_st);
  g.reshape("reshape_p", prob, p_t);
  if (grouped) {
    const int dv_full = g.virt("dV_fullhead", DataType::bf16, per_q_head, per_q_head_st);
    g.matmul("matmul_pT_dO", p_t, dout, dv_full);
    g.reduction("red_dV_head", Mode::sum, dv_full, dv);
  } else {
    g.matmul("matmul_pT_dO", p_t, dout, dv);
  }

  // dS = scale * P * (dP * 1 - D), dP = dO V^T
  const int dp = g.virt("dP", DataType::f32, scores, scores_st);
  const int dp_scaled = g.virt("dP_scaled", DataType::f32, scores, scores_st);
  const int dp_centred = g.virt("dP_minus_D", DataType::f32, scores, scores_st);
  const int ds_unscaled = g.virt("dS_unscaled", DataType::f32, scores, scores_st);
  const int ds = g.virt("dS", DataType::f32, scores, scores_st);
  g.matmul("matmul_dO_VT", dout, vt, dp);
  g.pointwise("dP_dropout_mask", Mode::mul, dp, one, dp_scaled);
  g.pointwise("sub_dP_softmax_sum", Mode::sub, dp_scaled, softmax_sum, dp_centred);
  g.pointwise("mul_dP_exp_s", Mode::mul, dp_centred, prob, ds_unscaled);
  g.pointwise("mul_dS_attn_scale", Mode::mul, ds_unscaled, x.scale, ds);

  // dK = sum over the group of dS^T Q
  const int ds_t = g.virt("dS^T", DataType::bf16, scores, scores_t_st);
  g.reshape("reshape_dS", ds, ds_t);
  if (grouped) {
    const int dk_full = g.virt("dK_fullhead", DataType::bf16, per_q_head, per_q_head_st);
    g.matmul("matmul_dST_Q", ds_t, x.q, dk_full);
    g.reduction("red_dK_head", Mode::sum, dk_full, dk);
  } else {
    g.matmul("matmul_dST_Q", ds_t, x.q, dk);
  }

  // dQ = dS K, accumulated in f32, then to bf16
  const int k_rows = g.virt("K", DataType::bf16, {b, k, s, d}, {s * p.ldk, d, p.ldk, 1});
  g.reshape("reshape_k", x.kt, k_rows);
  g.matmul("matmul_dS_K", ds, k_rows, dq_acc);
  g.pointwise("identity_dQ", Mode::identity, dq_acc, -1, dq);
  return g.take();
}

const char* name(DataType t) {
  switch (t) {
    case DataType::f32:
      return "f32";
    case DataType::bf16:
      return "bf16";
    case DataType::i32:
      return "i32";
    case DataType::boolean:
      return "bool";
  }
  return "?";
}

const char* name(Op op) {
  switch (op) {
    case Op::matmul:
      return "matmul";
    case Op::pointwise:
      return "pointwise";
    case Op::reduction:
      return "reduction";
    case Op::reshape:
      return "reshape";
  }
  return "?";
}

const char* name(Mode m) {
  switch (m) {
    case Mode::none:
      return "";
    case Mode::add:
      return "ADD";
    case Mode::sub:
      return "SUB";
    case Mode::mul:
      return "MUL";
    case Mode::div:
      return "DIV";
    case Mode::exp:
      return "EXP";
    case Mode::log:
      return "LOG";
    case Mode::identity:
      return "IDENTITY";
    case Mode::gen_index:
      return "GEN_INDEX";
    case Mode::cmp_ge:
      return "CMP_GE";
    case Mode::binary_select:
      return "BINARY_SELECT";
    case Mode::sum:
      return "ADD";
    case Mode::max:
      return "MAX";
  }
  return "?";
}

}  // namespace llama3::sdpa_graph

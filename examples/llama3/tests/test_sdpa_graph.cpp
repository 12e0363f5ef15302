// The attention graphs cuDNN receives (sdpa_graph.hpp), checked without a GPU against the graph NVIDIA's
// cudnn-frontend 1.7.0 builds for SDPA backward (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h,
// SDPABackwardNode::expand_node) with a causal mask, an attention scale, no dropout, no bias, no padding mask, on
// cuDNN 9 (no dP workspace: dQ goes through a non-virtual f32 accumulator). The table below is that function read
// node by node for those options: its node names, modes, compute types, inputs and output tensors. A difference
// here is a graph cuDNN's runtime-fusion engine may not recognise, and the window would measure the unfused path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sdpa_graph.hpp"
#include "zero3/error.hpp"

using namespace llama3::sdpa_graph;

namespace {

struct Expected {
  std::string name;
  Op op;
  Mode mode;
  std::string x, b, y, t;  // tensor names; "" when absent
};

// The frontend's SDPA backward for MHA (h == k); `grouped` adds the GQA/MQA reductions over each head group.
std::vector<Expected> frontend_backward(bool grouped) {
  std::vector<Expected> e = {
      // "dO * o => softmax_sum": D virtual, through the dropout-inverse scale (1 without dropout)
      {"mul_dO_O", Op::pointwise, Mode::mul, "dO", "O", "dO_O", ""},
      {"reduce_dO_o", Op::reduction, Mode::sum, "dO_O", "", "dO_O_sum", ""},
      {"scale_dropout_inv", Op::pointwise, Mode::mul, "dO_O_sum", "one", "softmax_sum", ""},
      // "Q @ KT => exp_softmax": scale, causal mask on the scaled scores, then minus the stats, then exp
      {"matmul_Q_KT", Op::matmul, Mode::none, "Q", "K^T", "S", ""},
      {"mul_s_attn_scale", Op::pointwise, Mode::mul, "S", "attn_scale", "S_scaled", ""},
      {"gen_row_idx_causal", Op::pointwise, Mode::gen_index, "S_scaled", "", "row_idx", ""},
      {"gen_col_idx_causal", Op::pointwise, Mode::gen_index, "S_scaled", "", "col_idx", ""},
      {"row_greater_than_col", Op::pointwise, Mode::cmp_ge, "row_idx", "col_idx", "causal_mask", ""},
      {"binary_select", Op::pointwise, Mode::binary_select, "S_scaled", "lowest", "masked", "causal_mask"},
      {"sub_s_m", Op::pointwise, Mode::sub, "masked", "Stats", "S_minus_stats", ""},
      {"exp_s", Op::pointwise, Mode::exp, "S_minus_stats", "", "exp_s", ""},
      // "=> dV"
      {"reshape_p", Op::reshape, Mode::none, "exp_s", "", "P^T", ""},
  };
  if (grouped) {
    e.push_back({"matmul_pT_dO", Op::matmul, Mode::none, "P^T", "dO", "dV_fullhead", ""});
    e.push_back({"red_dV_head", Op::reduction, Mode::sum, "dV_fullhead", "", "dV", ""});
  } else {
    e.push_back({"matmul_pT_dO", Op::matmul, Mode::none, "P^T", "dO", "dV", ""});
  }
  // "dO @ VT => dS_output => dK": dP times the dropout mask (1 without dropout), minus D, times P, times the scale
  std::vector<Expected> ds = {
      {"matmul_dO_VT", Op::matmul, Mode::none, "dO", "V^T", "dP", ""},
      {"dP_dropout_mask", Op::pointwise, Mode::mul, "dP", "one", "dP_scaled", ""},
      {"sub_dP_softmax_sum", Op::pointwise, Mode::sub, "dP_scaled", "softmax_sum", "dP_minus_D", ""},
      {"mul_dP_exp_s", Op::pointwise, Mode::mul, "dP_minus_D", "exp_s", "dS_unscaled", ""},
      {"mul_dS_attn_scale", Op::pointwise, Mode::mul, "dS_unscaled", "attn_scale", "dS", ""},
      {"reshape_dS", Op::reshape, Mode::none, "dS", "", "dS^T", ""},
  };
  e.insert(e.end(), ds.begin(), ds.end());
  if (grouped) {
    e.push_back({"matmul_dST_Q", Op::matmul, Mode::none, "dS^T", "Q", "dK_fullhead", ""});
    e.push_back({"red_dK_head", Op::reduction, Mode::sum, "dK_fullhead", "", "dK", ""});
  } else {
    e.push_back({"matmul_dST_Q", Op::matmul, Mode::none, "dS^T", "Q", "dK", ""});
  }
  // "dp_scaled @ K => dQ": K from K^T by a reshape, dQ accumulated in f32, then an identity to dQ's type
  e.push_back({"reshape_k", Op::reshape, Mode::none, "K^T", "", "K", ""});
  e.push_back({"matmul_dS_K", Op::matmul, Mode::none, "dS", "K", "dQ_accum", ""});
  e.push_back({"identity_dQ", Op::pointwise, Mode::identity, "dQ_accum", "", "dQ", ""});
  return e;
}

std::string tensor_name(const Graph& g, int i) { return i < 0 ? "" : g.tensors.at(static_cast<size_t>(i)).name; }

std::string describe(const Graph& g, const Node& n) {
  return n.name + ": " + name(n.op) + " " + name(n.mode) + "(" + tensor_name(g, n.x) + ", " + tensor_name(g, n.b) +
         ", t " + tensor_name(g, n.t) + ") -> " + tensor_name(g, n.y);
}

std::string describe(const Expected& e) {
  return e.name + ": " + name(e.op) + " " + name(e.mode) + "(" + e.x + ", " + e.b + ", t " + e.t + ") -> " + e.y;
}

// b 2, seq 256, head_dim 64 on the fused projections' row strides.
Shape shape(int64_t heads, int64_t kv_heads) {
  const int64_t d = 64, ldq = heads * d, ldkv = kv_heads * d;
  return {2, 256, heads, kv_heads, d, ldq, ldkv, ldkv, ldq, ldq, ldq, ldkv, ldkv};
}

void expect_nodes(const Graph& g, const std::vector<Expected>& want) {
  ASSERT_EQ(g.nodes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(describe(g, g.nodes[i]), describe(want[i])) << "node " << i;
  }
}

}  // namespace

TEST(SdpaGraph, BackwardNodesAreTheFrontendsForMultiHeadAttention) {
  expect_nodes(backward_graph(shape(4, 4)), frontend_backward(false));
}

TEST(SdpaGraph, BackwardNodesAreTheFrontendsForGroupedQueryAttention) {
  expect_nodes(backward_graph(shape(8, 2)), frontend_backward(true));
  expect_nodes(backward_graph(shape(8, 1)), frontend_backward(true));  // multi-query
}

TEST(SdpaGraph, TheIndexGeneratorsComputeInInt32AndTheMaskInBoolean) {
  for (const Graph& g : {backward_graph(shape(8, 2)), forward_graph(shape(8, 2))}) {
    int gen = 0;
    for (const Node& n : g.nodes) {
      if (n.mode == Mode::gen_index) {
        ++gen;
        EXPECT_EQ(n.compute, DataType::i32) << n.name;
        EXPECT_EQ(g.tensors[static_cast<size_t>(n.y)].type, DataType::i32) << n.name;
        EXPECT_EQ(n.axis, n.name == "gen_row_idx_causal" ? 2 : 3) << n.name;
      } else if (n.mode == Mode::cmp_ge) {
        EXPECT_EQ(n.compute, DataType::boolean);
        EXPECT_EQ(g.tensors[static_cast<size_t>(n.y)].type, DataType::boolean);
      } else {
        EXPECT_EQ(n.compute, DataType::f32) << n.name;
        EXPECT_EQ(n.axis, -1) << n.name;
      }
    }
    EXPECT_EQ(gen, 2);
  }
}

TEST(SdpaGraph, BackwardIntermediatesAreVirtualButTheF16x16DqAccumulator) {
  const Shape p = shape(8, 2);
  const Graph g = backward_graph(p);
  // What the caller binds: the operands, the three by-value scalars and the dQ accumulator; D is virtual.
  std::vector<std::string> bound;
  for (const Tensor& t : g.tensors) {
    if (!t.is_virtual) bound.push_back(t.name);
    EXPECT_EQ(t.is_virtual, t.uid >= kVirtual) << t.name;
    EXPECT_EQ(t.reordering, t.name == "dQ_accum" ? Reordering::f16x16 : Reordering::none) << t.name;
  }
  EXPECT_EQ(bound, (std::vector<std::string>{"Q", "K^T", "O", "Stats", "attn_scale", "lowest", "V^T", "one", "dO", "dQ",
                                             "dK", "dV", "dQ_accum"}));
  for (const char* scalar : {"attn_scale", "lowest", "one"}) {
    const Tensor& t = g.tensors[static_cast<size_t>(g.find(scalar))];
    EXPECT_TRUE(t.by_value) << scalar;
    EXPECT_EQ(t.dims, (Dims{1, 1, 1, 1})) << scalar;
  }
  const Tensor& acc = g.tensors[static_cast<size_t>(g.find("dQ_accum"))];
  EXPECT_EQ(acc.type, DataType::f32);
  EXPECT_EQ(acc.dims, (Dims{p.b, p.h, p.s, p.d}));
  EXPECT_EQ(acc.strides, (Dims{p.h * p.s * p.d, p.s * p.d, p.d, 1}));  // packed: what the caller zeroes
  // The frontend's virtual tensors: D and the statistics chain in f32, the transposed P and dS in the input type.
  EXPECT_EQ(g.tensors[static_cast<size_t>(g.find("softmax_sum"))].dims, (Dims{p.b, p.h, p.s, 1}));
  EXPECT_EQ(g.tensors[static_cast<size_t>(g.find("dO_O"))].strides, (Dims{p.h * p.s * p.d, p.s * p.d, p.h * p.d, 1}));
  for (const char* t : {"P^T", "dS^T", "dV_fullhead", "dK_fullhead", "K"}) {
    EXPECT_EQ(g.tensors[static_cast<size_t>(g.find(t))].type, DataType::bf16) << t;
  }
  EXPECT_EQ(g.tensors[static_cast<size_t>(g.find("P^T"))].strides, (Dims{p.h * p.s * p.s, p.s * p.s, 1, p.s}));
  for (const char* t : {"S", "S_scaled", "masked", "S_minus_stats", "exp_s", "dP", "dP_scaled", "dS"}) {
    const Tensor& s = g.tensors[static_cast<size_t>(g.find(t))];
    EXPECT_EQ(s.type, DataType::f32) << t;
    EXPECT_EQ(s.dims, (Dims{p.b, p.h, p.s, p.s})) << t;
  }
}

TEST(SdpaGraph, EveryNodeReadsTensorsWrittenBeforeIt) {
  for (const Graph& g : {backward_graph(shape(4, 4)), backward_graph(shape(8, 2)), forward_graph(shape(8, 2))}) {
    std::vector<bool> ready(g.tensors.size());
    for (size_t i = 0; i < g.tensors.size(); ++i) ready[i] = !g.tensors[i].is_virtual;
    for (const Node& n : g.nodes) {
      for (int in : {n.x, n.b, n.t}) {
        if (in >= 0) {
          EXPECT_TRUE(ready[static_cast<size_t>(in)]) << n.name << " reads " << tensor_name(g, in);
        }
      }
      ASSERT_GE(n.y, 0) << n.name;
      ready[static_cast<size_t>(n.y)] = true;
    }
    std::vector<int64_t> uids;
    for (const Tensor& t : g.tensors) {
      for (int64_t u : uids) EXPECT_NE(u, t.uid) << t.name;
      uids.push_back(t.uid);
    }
  }
}

TEST(SdpaGraph, FindNamesAMissingTensor) {
  const Graph g = forward_graph(shape(4, 4));
  EXPECT_THROW(g.find("no such tensor"), zero3::InvalidArgument);
}

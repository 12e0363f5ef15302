// The operation graphs of cuDNN's fused attention (cuda/cudnn_attention.cpp), as plain data: every tensor (its
// type, dims, strides, whether it is virtual, passed by value or reordered) and every node (matmul, pointwise,
// reduction, reshape; its mode, compute type and axis; its inputs and output), in the order the nodes are added.
// cuda/cudnn_attention.cpp turns a Graph into cuDNN backend descriptors one node at a time and adds nothing of its
// own, so what is tested here without a GPU (tests/test_sdpa_graph.cpp) is the graph cuDNN receives.
//
// The graphs are the "composite" SDPA graphs NVIDIA's cudnn-frontend builds (its SDPANode / SDPABackwardNode
// expand_node, release 1.7.0) for a causal, scaled, dropout-free attention in bf16 with f32 statistics, the form
// cuDNN's runtime-fusion engines recognise as flash attention. Node names are the frontend's, so the two read side
// by side. Layouts (b = batch, h = query heads, k = kv heads, s = seq, d = head_dim; row-major token layout of the
// fused projections, element (b, h, t, e) of Q at b*s*ldq + t*ldq + h*d + e):
//   Q, O, dO, dQ  dims (b, h, s, d)  strides (s*ld, d, ld, 1)
//   K^T, V^T      dims (b, k, d, s)  strides (s*ld, d, 1, ld)     (cuDNN's matmul takes K and, in backward, V
//                                                                   transposed)
//   V, dK, dV     dims (b, k, s, d)  strides (s*ld, d, ld, 1)
//   Stats (lse)   dims (b, h, s, 1)  f32, strides (h*s, s, 1, 1)
// The matmuls broadcast the k kv heads over the h query heads (h a multiple of k); in backward the per-query-head
// dK and dV are summed over each group by a reduction.
//
// Forward:  S = scale * Q K^T, causal mask (row index >= column index keeps, else the lowest float), M = rowmax,
//           E = exp(S - M), Z = rowsum(E), Stats = M + log(Z), P = E / Z (bf16), O = P V.
// Backward: D = rowsum(dO * O) * 1 (virtual), S = mask(scale * Q K^T) - Stats, P = exp(S),
//           dV = sum over the group of P^T dO, dS = scale * P * (dP * 1 - D) with dP = dO V^T,
//           dK = sum over the group of dS^T Q, dQ = dS K into an f32 accumulator (F16x16 reordering, zeroed
//           before each run, in the caller's workspace), converted to bf16.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace llama3::sdpa_graph {

enum class DataType { f32, bf16, i32, boolean };
enum class Reordering { none, f16x16 };
enum class Op { matmul, pointwise, reduction, reshape };
enum class Mode { none, add, sub, mul, div, exp, log, identity, gen_index, cmp_ge, binary_select, sum, max };

using Dims = std::array<int64_t, 4>;

struct Tensor {
  std::string name;
  int64_t uid = 0;
  DataType type = DataType::f32;
  Dims dims{}, strides{};
  bool is_virtual = true;
  bool by_value = false;  // a scalar given by value in the variant pack
  Reordering reordering = Reordering::none;
};

// y = op(x [, b] [, t]); indices into Graph::tensors, -1 when absent. compute: the pointwise node's math
// precision (matmul and reduction nodes compute in f32). axis: GEN_INDEX's axis, else -1.
struct Node {
  std::string name;
  Op op = Op::pointwise;
  Mode mode = Mode::none;
  DataType compute = DataType::f32;
  int64_t axis = -1;
  int x = -1, b = -1, t = -1, y = -1;
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  // The index of the tensor called `name`; InvalidArgument when there is none.
  int find(const std::string& name) const;
};

// A graph's shape: dims and the row strides (elements) of each operand. Backward uses all of them, forward
// ldq, ldk, ldv and ldo.
struct Shape {
  int64_t b = 0, s = 0, h = 0, k = 0, d = 0;
  int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0, lddo = 0, lddq = 0, lddk = 0, lddv = 0;
};

// Unique ids of the tensors the caller binds in the variant pack; intermediates from kVirtual on.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kLowest,
  kDO,
  kDQ,
  kDK,
  kDV,
  kOne,
  kDQAcc,
  kVirtual = 100,
};

Graph forward_graph(const Shape& shape);
Graph backward_graph(const Shape& shape);

const char* name(DataType t);
const char* name(Op op);
const char* name(Mode m);

}  // namespace llama3::sdpa_graph

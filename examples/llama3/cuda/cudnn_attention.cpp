// cuDNN fused attention (cudnn_attention.hpp): the operation graphs, the per-shape plan cache, execution.
//
// The graphs themselves (tensors, nodes, the cudnn-frontend release they follow) are sdpa_graph.hpp's; this file
// turns them into cuDNN backend descriptors, plans them once per shape and executes them.
#include "cuda/cudnn_attention.hpp"

#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "sdpa_graph.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace llama3::cuda {
namespace {

// A failing cuDNN call: zero3::CudaError "<call> failed: CUDNN_STATUS_X: <cuDNN's last message> (file:line)".
[[noreturn]] void throw_cudnn_error(const std::string& what, cudnnStatus_t status, const char* file, int line) {
  char message[512] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  throw zero3::CudaError(what + " failed: " + cudnnGetErrorString(status) + (message[0] ? std::string(": ") + message : "") +
                         " (" + file + ":" + std::to_string(line) + ")");
}

#define LLAMA3_CUDNN_CHECK(stmt)                                                          \
  do {                                                                                    \
    const cudnnStatus_t llama3_cudnn_status_ = (stmt);                                    \
    if (llama3_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                     \
      ::llama3::cuda::throw_cudnn_error(#stmt, llama3_cudnn_status_, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor (owned).
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { LLAMA3_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    LLAMA3_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, value));
    return *this;
  }
  Desc& set(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  Desc& finalize() {
    LLAMA3_CUDNN_CHECK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A graph of sdpa_graph.hpp as cuDNN backend descriptors: each tensor once, each node as its operation, in order.
// Nothing is added here; what sdpa_graph builds (and tests/test_sdpa_graph.cpp checks) is what cuDNN receives.
class GraphBuilder {
 public:
  explicit GraphBuilder(const sdpa_graph::Graph& graph) {
    for (const sdpa_graph::Tensor& t : graph.tensors) tensors_.push_back(&tensor(t));
    for (const sdpa_graph::Node& n : graph.nodes) {
      switch (n.op) {
        case sdpa_graph::Op::matmul: matmul(at(n.x), at(n.b), at(n.y)); break;
        case sdpa_graph::Op::pointwise:
          pointwise(pointwise_mode(n.mode), at(n.x), n.b >= 0 ? &at(n.b) : nullptr, at(n.y),
                    n.t >= 0 ? &at(n.t) : nullptr, data_type(n.compute), n.axis);
          break;
        case sdpa_graph::Op::reduction:
          reduction(n.mode == sdpa_graph::Mode::max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD, at(n.x), at(n.y));
          break;
        case sdpa_graph::Op::reshape: reshape(at(n.x), at(n.y)); break;
      }
    }
  }

  // The operation graph, cuDNN's heuristics (mode A), and the first engine configuration whose plan finalises.
  // Throws zero3::CudaError when none does (the caller treats that as "unsupported").
  Desc plan(cudnnHandle_t handle, int64_t& workspace) {
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
              ops_.data())
        .set(static_cast<cudnnBackendAttributeName_t>(800 /* CUDNN_ATTR_OPERATIONGRAPH_HANDLE, deprecated name */),
             CUDNN_TYPE_HANDLE, 1, &handle)
        .finalize();
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
        .finalize();
    int64_t count = 0;
    LLAMA3_CUDNN_CHECK(
        cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr));
    if (count <= 0) {
      throw zero3::CudaError("cuDNN's heuristics found no engine for the attention graph");
    }
    std::vector<Desc> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t got = 0;
    LLAMA3_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
    std::string last;
    for (int64_t i = 0; i < got; ++i) {
      try {
        Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan.set(static_cast<cudnnBackendAttributeName_t>(400 /* CUDNN_ATTR_EXECUTION_PLAN_HANDLE */),
                 CUDNN_TYPE_HANDLE, 1, &handle)
            .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<size_t>(i)])
            .finalize();
        LLAMA3_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, nullptr, &workspace));
        return plan;
      } catch (const zero3::CudaError& e) {
        last = e.what();  // this engine does not take the graph; try the next
      }
    }
    throw zero3::CudaError("no engine of the " + std::to_string(got) +
                           " cuDNN proposed builds a plan for the attention graph (last: " + last + ")");
  }

 private:
  static cudnnDataType_t data_type(sdpa_graph::DataType t) {
    switch (t) {
      case sdpa_graph::DataType::f32: return CUDNN_DATA_FLOAT;
      case sdpa_graph::DataType::bf16: return CUDNN_DATA_BFLOAT16;
      case sdpa_graph::DataType::i32: return CUDNN_DATA_INT32;
      case sdpa_graph::DataType::boolean: return CUDNN_DATA_BOOLEAN;
    }
    throw zero3::InvalidArgument("cuDNN attention: unknown tensor data type");
  }

  static cudnnPointwiseMode_t pointwise_mode(sdpa_graph::Mode m) {
    switch (m) {
      case sdpa_graph::Mode::add: return CUDNN_POINTWISE_ADD;
      case sdpa_graph::Mode::sub: return CUDNN_POINTWISE_SUB;
      case sdpa_graph::Mode::mul: return CUDNN_POINTWISE_MUL;
      case sdpa_graph::Mode::div: return CUDNN_POINTWISE_DIV;
      case sdpa_graph::Mode::exp: return CUDNN_POINTWISE_EXP;
      case sdpa_graph::Mode::log: return CUDNN_POINTWISE_LOG;
      case sdpa_graph::Mode::identity: return CUDNN_POINTWISE_IDENTITY;
      case sdpa_graph::Mode::gen_index: return CUDNN_POINTWISE_GEN_INDEX;
      case sdpa_graph::Mode::cmp_ge: return CUDNN_POINTWISE_CMP_GE;
      case sdpa_graph::Mode::binary_select: return CUDNN_POINTWISE_BINARY_SELECT;
      default: break;
    }
    throw zero3::InvalidArgument(std::string("cuDNN attention: ") + sdpa_graph::name(m) + " is not a pointwise mode");
  }

  const Desc& at(int i) const { return *tensors_.at(static_cast<size_t>(i)); }

  const Desc& tensor(const sdpa_graph::Tensor& spec) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool virt = spec.is_virtual, value = spec.by_value;
    const cudnnDataType_t type = data_type(spec.type);
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, spec.dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, spec.strides.data())
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &spec.uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value);
    if (spec.reordering == sdpa_graph::Reordering::f16x16) {
      const cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_F16x16;
      t.set(CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder);
    }
    t.finalize();
    keep_.push_back(std::move(t));
    return keep_.back();
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
        .finalize();
    add_op(std::move(mm), std::move(op));
  }

  // y = mode(x [, b] [, t]); axis >= 0 for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y, const Desc* t,
                 cudnnDataType_t precision, int64_t axis) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.finalize();
    add_op(std::move(pw), std::move(op));
  }

  void reduction(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32)
        .finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red)
        .finalize();
    add_op(std::move(red), std::move(op));
  }

  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y).finalize();
    ops_.push_back(op.get());
    keep_.push_back(std::move(op));
  }

  void add_op(Desc&& desc, Desc&& op) {
    ops_.push_back(op.get());
    keep_.push_back(std::move(desc));
    keep_.push_back(std::move(op));
  }

  std::deque<Desc> keep_;  // a deque: tensor() hands out references that later pushes must not move
  std::vector<const Desc*> tensors_;  // sdpa_graph::Graph::tensors, by index
  std::vector<cudnnBackendDescriptor_t> ops_;
};

using sdpa_graph::kDK;
using sdpa_graph::kDO;
using sdpa_graph::kDQ;
using sdpa_graph::kDQAcc;
using sdpa_graph::kDV;
using sdpa_graph::kK;
using sdpa_graph::kLowest;
using sdpa_graph::kO;
using sdpa_graph::kOne;
using sdpa_graph::kQ;
using sdpa_graph::kScale;
using sdpa_graph::kStats;
using sdpa_graph::kV;

struct Key {
  bool backward;
  int64_t b, s, h, k, d, ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv;
  bool operator<(const Key& o) const {
    return std::tie(backward, b, s, h, k, d, ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv) <
           std::tie(o.backward, o.b, o.s, o.h, o.k, o.d, o.ldq, o.ldk, o.ldv, o.ldo, o.lddo, o.lddq, o.lddk, o.lddv);
  }
};

struct Plan {
  std::unique_ptr<Desc> plan;  // null: cuDNN refused this shape
  int64_t workspace = 0;
};

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

std::string shape_name(const Key& k) {
  return std::string(k.backward ? "backward" : "forward") + " batch " + std::to_string(k.b) + ", seq " +
         std::to_string(k.s) + ", heads " + std::to_string(k.h) + ", kv heads " + std::to_string(k.k) +
         ", head_dim " + std::to_string(k.d);
}

Desc build_plan(cudnnHandle_t handle, const Key& key, int64_t& workspace) {
  const sdpa_graph::Shape shape{key.b,   key.s,   key.h,    key.k,    key.d,    key.ldq,  key.ldk,
                                key.ldv, key.ldo, key.lddo, key.lddq, key.lddk, key.lddv};
  GraphBuilder g(key.backward ? sdpa_graph::backward_graph(shape) : sdpa_graph::forward_graph(shape));
  return g.plan(handle, workspace);
}

}  // namespace

struct CudnnAttention::Impl {
  cudaStream_t stream = nullptr;
  Allocator allocator;
  cudnnHandle_t handle = nullptr;
  int sm_major = 0;
  std::map<Key, Plan> plans;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  int64_t plans_built = 0, forward_runs = 0, backward_runs = 0;

  // The plan of `key`, built on first use; null when cuDNN refused the shape (said once, in a warning).
  Desc* plan_for(const Key& key, int64_t& workspace_size) {
    auto it = plans.find(key);
    if (it == plans.end()) {
      Plan p;
      try {
        int64_t ws = 0;
        p.plan = std::make_unique<Desc>(build_plan(handle, key, ws));
        p.workspace = ws;
        ++plans_built;
      } catch (const zero3::CudaError& e) {
        zero3::log::warn("cuDNN attention: ", shape_name(key), " falls back to the cuBLAS path: ", e.what());
      }
      it = plans.emplace(key, std::move(p)).first;
    }
    workspace_size = it->second.workspace;
    return it->second.plan.get();
  }

  char* reserve(int64_t bytes) {
    if (bytes > workspace_bytes) {
      if (workspace != nullptr) allocator.free(workspace, static_cast<size_t>(workspace_bytes));
      workspace = nullptr;
      workspace_bytes = 0;
      workspace = allocator.allocate(static_cast<size_t>(bytes));
      workspace_bytes = bytes;
    }
    return static_cast<char*>(workspace);
  }

  void execute(Desc& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers, void* ws) {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
             pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
        .finalize();
    LLAMA3_CUDNN_CHECK(cudnnSetStream(handle, stream));
    LLAMA3_CUDNN_CHECK(cudnnBackendExecute(handle, plan.get(), pack.get()));
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream, Allocator allocator) : impl_(std::make_unique<Impl>()) {
  if (!allocator.allocate || !allocator.free) {
    throw zero3::InvalidArgument("CudnnAttention: the allocator needs both allocate and free");
  }
  impl_->stream = stream;
  impl_->allocator = std::move(allocator);
  int device = 0;
  LLAMA3_CUDA_CHECK(cudaGetDevice(&device));
  LLAMA3_CUDA_CHECK(cudaDeviceGetAttribute(&impl_->sm_major, cudaDevAttrComputeCapabilityMajor, device));
  if (version() < 90000) {
    throw zero3::CudaError("CudnnAttention: the loaded cuDNN is " + std::to_string(version()) +
                           "; the fused attention graphs need cuDNN 9");
  }
  LLAMA3_CUDNN_CHECK(cudnnCreate(&impl_->handle));
}

CudnnAttention::~CudnnAttention() {
  impl_->plans.clear();  // plans before the handle they were built with
  if (impl_->workspace != nullptr) impl_->allocator.free(impl_->workspace, static_cast<size_t>(impl_->workspace_bytes));
  if (impl_->handle != nullptr) cudnnDestroy(impl_->handle);
}

int64_t CudnnAttention::version() { return static_cast<int64_t>(cudnnGetVersion()); }
int64_t CudnnAttention::workspace_bytes() const { return impl_->workspace_bytes; }
int64_t CudnnAttention::plans_built() const { return impl_->plans_built; }
int64_t CudnnAttention::forward_runs() const { return impl_->forward_runs; }
int64_t CudnnAttention::backward_runs() const { return impl_->backward_runs; }

std::string CudnnAttention::unsupported_reason(const AttentionDims& d, DType act, bool backward) const {
  if (act != DType::bf16) return "cuDNN's fused attention runs bf16 only (act is " + std::string(zero3::dtype_name(act)) + ")";
  if (impl_->sm_major < 8) return "cuDNN's fused attention needs compute capability 8.0 or newer";
  if (d.head_dim % 8 != 0 || d.head_dim > 128) return "head_dim must be a multiple of 8 up to 128";
  if (d.batch <= 0 || d.seq < 2) return "fewer than two tokens per sequence";
  if (d.n_kv_heads <= 0 || d.n_heads % d.n_kv_heads != 0) return "n_kv_heads must divide n_heads";
  const int64_t v = version();
  if (backward && (v == 91000 || v == 91001)) return "cuDNN 9.10.0/9.10.1 have a known bug in the attention backward";
  // Up to 9.15 the backward needs a padding mask when seq is not a multiple of 128 (NVIDIA's frontend adds one as a
  // workaround); this file does not build that variant.
  if (backward && v <= 91500 && d.seq % 128 != 0) return "cuDNN <= 9.15 backward needs seq to be a multiple of 128";
  return "";
}

bool CudnnAttention::forward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk,
                             const void* v, int64_t ldv, void* out, int64_t ldo, float* lse, DType act) {
  if (!unsupported_reason(d, act, false).empty()) return false;
  for (const void* p : {q, k, v, static_cast<const void*>(out), static_cast<const void*>(lse)}) {
    if (!aligned16(p)) return false;
  }
  if (ldq % 8 != 0 || ldk % 8 != 0 || ldv % 8 != 0 || ldo % 8 != 0) return false;
  const Key key{false, d.batch, d.seq, d.n_heads, d.n_kv_heads, d.head_dim, ldq, ldk, ldv, ldo, 0, 0, 0, 0};
  int64_t ws_size = 0;
  Desc* plan = impl_->plan_for(key, ws_size);
  if (plan == nullptr) return false;
  char* ws = impl_->reserve(std::max<int64_t>(ws_size, 1));
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  float lowest = std::numeric_limits<float>::lowest();
  impl_->execute(*plan, {kQ, kK, kV, kO, kStats, kScale, kLowest},
                 {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale, &lowest}, ws);
  ++impl_->forward_runs;
  return true;
}

bool CudnnAttention::backward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk,
                              const void* v, int64_t ldv, const void* out, int64_t ldo, const float* lse,
                              const void* dout, int64_t lddo, void* dq, int64_t lddq, void* dk, int64_t lddk, void* dv,
                              int64_t lddv, DType act) {
  if (!unsupported_reason(d, act, true).empty()) return false;
  for (const void* p : {q, k, v, out, static_cast<const void*>(lse), dout, static_cast<const void*>(dq),
                        static_cast<const void*>(dk), static_cast<const void*>(dv)}) {
    if (!aligned16(p)) return false;
  }
  for (int64_t ld : {ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv}) {
    if (ld % 8 != 0) return false;
  }
  const Key key{true, d.batch, d.seq, d.n_heads, d.n_kv_heads, d.head_dim, ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv};
  int64_t ws_size = 0;
  Desc* plan = impl_->plan_for(key, ws_size);
  if (plan == nullptr) return false;
  const int64_t rows = d.batch * d.n_heads * d.seq;
  const int64_t dq_acc_bytes = align_up(rows * d.head_dim * 4);
  char* ws = impl_->reserve(dq_acc_bytes + std::max<int64_t>(ws_size, 1));
  void* dq_acc = ws;
  LLAMA3_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(rows * d.head_dim * 4), impl_->stream));
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  float lowest = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  impl_->execute(*plan, {kQ, kK, kV, kO, kStats, kScale, kLowest, kOne, kDO, kDQ, kDK, kDV, kDQAcc},
                 {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(out),
                  const_cast<float*>(lse), &scale, &lowest, &one, const_cast<void*>(dout), dq, dk, dv, dq_acc},
                 ws + dq_acc_bytes);
  ++impl_->backward_runs;
  return true;
}

}  // namespace llama3::cuda

// Grouped-query causal attention through cuDNN 9's fused flash attention (built with LLAMA3_HAVE_CUDNN only).
//
// Same contract as cuda_ops.hpp Attention (same arguments, layouts and formulas), for bf16 activations:
//   O = softmax(scale * Q K^T + causal mask) V,  scale = 1/sqrt(head_dim), query head h on kv head h / group;
//   lse (batch, n_heads, seq) f32 = the natural log-sum-exp of each row of the scaled, masked scores: what the
//   cuBLAS path writes, so either path's backward reads either path's forward.
// cuDNN computes both matmuls with f32 accumulation and the softmax and its statistics in f32; it never
// materialises the seq x seq scores (flash attention), and skips the masked half.
//
// The graphs (sdpa_graph.hpp) are the operation graphs NVIDIA's cudnn-frontend builds for SDPA in its "composite"
// form, which cuDNN's runtime-fusion engines recognise as flash attention, written with cuDNN's graph (backend) C API
// (cudnn_graph.h); the single-node SDPA descriptor has no causal mask before cuDNN 9.21. A graph is built, its
// engine chosen by cuDNN's heuristics (mode A) and its execution plan finalised once per shape (dims and row
// strides) and kept; later calls with the same shape only execute the plan.
//
// forward()/backward() return false, queue nothing and remember the shape when cuDNN has no engine for it (or the
// combination is one this file routes away from, see supported()): the caller then runs the cuBLAS path.
// A failure while executing a plan throws zero3::CudaError naming the cuDNN call and status.
//
// Workspace: cuDNN's own workspace and, in backward, the f32 dQ accumulator, in one buffer
// from the allocator given at construction (the zero3 device's caching allocator), grown on demand and freed
// stream-ordered. All work runs on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cuda/cuda_ops.hpp"

namespace llama3::cuda {

class CudnnAttention {
 public:
  struct Allocator {
    std::function<void*(size_t)> allocate;
    std::function<void(void*, size_t)> free;  // stream-ordered on the attention's stream
  };

  // Creates the cuDNN handle on the current device. Throws zero3::CudaError when cuDNN cannot start (e.g. the
  // loaded libcudnn is older than 9 or finds no device).
  CudnnAttention(cudaStream_t stream, Allocator allocator);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether this file routes the shape to cuDNN at all (act bf16, head_dim a multiple of 8 up to 128, at least
  // two tokens, no cuDNN release with a known bug for the graph); "" when it does, else the reason.
  std::string unsupported_reason(const AttentionDims& d, DType act, bool backward) const;

  bool forward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
               int64_t ldv, void* out, int64_t ldo, float* lse, DType act);
  bool backward(const AttentionDims& d, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
                int64_t ldv, const void* out, int64_t ldo, const float* lse, const void* dout, int64_t lddo, void* dq,
                int64_t lddq, void* dk, int64_t lddk, void* dv, int64_t lddv, DType act);

  // Device bytes the workspace holds now; plans built and executions so far (what the GPU tests check).
  int64_t workspace_bytes() const;
  int64_t plans_built() const;
  int64_t forward_runs() const;
  int64_t backward_runs() const;

  // The loaded library's version (cudnnGetVersion(), e.g. 91900 for 9.19.0).
  static int64_t version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llama3::cuda

// ModelOps on a CUDA device (builds with CUDA only: LLAMA3_HAVE_CUDA): cuda/cuda_ops.hpp behind the backend
// interface, so ModelRunner and EngineModel run the model on a GPU with the code they run on the CPU.
//
// act() is the engine's compute dtype, f32 or bf16 (f16 is zero3::Unsupported: the kernels have no f16
// path); weight gradients, rstd and log-sum-exp are f32. GEMMs go through cuBLAS with f32 accumulation
// (pedantic f32, no TF32, when act is f32).
//
// Stream: every op is queued on the device's compute stream, Device::default_stream() (CUDA's legacy default
// stream, or the caller's stream the device was made with), which the engine orders its gathers and reductions
// against, so a unit's parameters are ready when a scope opens and its gradients are complete when it
// closes, without host waits. copy_from_host does not wait either (it stages through pinned memory), nor does
// lm_head_cross_entropy: its row losses are summed into a device accumulator on the stream (cuda::add_rows, in
// row order, in double). Host waits: copy_to_host, synchronize and take_loss_sum (one 8-byte read, when the
// program asks for the loss: once per optimizer step in train_main).
//
// Memory: allocate() is the zero3 Device's (its stream-ordered pool; counted in its bytes_in_use and
// peak_bytes_in_use); free() is stream-ordered (Device::deallocate_after). The kernels' own workspaces
// (attention scores, chunks of logits) come from the same pool through cuda_ops and are reported by
// workspace_bytes().
//
// Attention: with bf16 and a build with cuDNN (LLAMA3_HAVE_CUDNN), cuDNN's fused flash attention
// (cuda/cudnn_attention.hpp) for every shape it takes; the cuBLAS + kernels path otherwise.
//
// The constructor makes device.index() the calling thread's current CUDA device; use the object from that
// thread. Throws zero3::InvalidArgument for a device that is not cuda, zero3::Unsupported for f16.
#pragma once

#include <memory>

#include "backend/model_ops.hpp"

namespace llama3 {
namespace cuda {
class Blas;
class Attention;
class CudnnAttention;
class LmHeadLoss;
}  // namespace cuda

class CudaModelOps final : public ModelOps {
 public:
  CudaModelOps(zero3::Device& device, zero3::DType act);
  ~CudaModelOps() override;
  CudaModelOps(const CudaModelOps&) = delete;
  CudaModelOps& operator=(const CudaModelOps&) = delete;

  std::string name() const override;
  zero3::DType act() const override { return act_; }

  void* allocate(size_t bytes) override;
  void free(void* ptr, size_t bytes) noexcept override;
  void zero(void* ptr, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override;
  int64_t workspace_bytes() const override;

  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
            const void* b, int64_t ldb, float beta, void* c, int64_t ldc, zero3::DType c_type) override;
  void embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t vocab, int64_t hidden,
                         void* x) override;
  void embedding_backward(const int32_t* ids, const int32_t* host_ids, int64_t tokens, const void* dx, int64_t vocab,
                          int64_t hidden, float* dtable) override;
  void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n, float eps) override;
  void add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd, int64_t rows,
                           int64_t n, float eps) override;
  void rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy, const void* residual, void* dx,
                        float* dw, int64_t rows, int64_t n) override;
  void rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                    const float* sin) override;
  void rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                     const float* sin) override;
  void swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter) override;
  void swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter) override;
  void add(const void* a, const void* b, void* y, int64_t n) override;
  void convert(const void* src, zero3::DType src_type, void* dst, zero3::DType dst_type, int64_t n) override;
  void attention_forward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v,
                         int64_t ldv, void* out, int64_t ldo, float* lse) override;
  void attention_backward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                          const void* v, int64_t ldv, const void* out, int64_t ldo, const float* lse, const void* dout,
                          int64_t lddo, void* dq, int64_t lddq, void* dk, int64_t lddk, void* dv,
                          int64_t lddv) override;
  int64_t lm_head_cross_entropy(const void* x, const void* w, const int32_t* targets, const int32_t* host_targets,
                                int64_t n, int64_t hidden, int64_t vocab, float grad_scale, void* dx, float* dw,
                                int64_t chunk_rows) override;
  double take_loss_sum() override;

  // Attention calls so far by path: cuDNN's fused kernels or the unfused cuBLAS + kernels path. Said in one line
  // at destruction ("attention paths: ..."), which scripts/gpu-run.sh reads: with bf16 every call should be fused.
  struct AttentionPaths {
    int64_t fused_forward = 0, fused_backward = 0, unfused_forward = 0, unfused_backward = 0;
  };
  AttentionPaths attention_paths() const { return paths_; }

 private:
  // A device buffer that only grows; freed stream-ordered.
  struct Scratch {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  void* ensure(Scratch& s, size_t bytes);

  zero3::Device& device_;
  zero3::DType act_;
  zero3::Stream stream_;  // the device's default stream
  std::unique_ptr<cuda::Blas> blas_;
  std::unique_ptr<cuda::Attention> attention_;
  // cuDNN's fused attention (bf16, builds with cuDNN); attention_ runs what it does not take. Null without it.
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;
  AttentionPaths paths_;
  std::unique_ptr<cuda::LmHeadLoss> lm_head_;
  Scratch row_loss_;  // (n) f32 per-row losses of the LM head
  // The loss accumulator: one double on the device; while nothing is pending (loss_pending_ false) its value is
  // stale and the next lm_head_cross_entropy overwrites it.
  Scratch loss_sum_;
  bool loss_pending_ = false;
  Scratch grouping_;  // the embedding backward's rows | offsets | token_ids, int32
  // Pinned host staging of the grouping, reused once the previous upload from it has finished.
  void* grouping_host_ = nullptr;
  size_t grouping_host_bytes_ = 0;
  std::unique_ptr<zero3::DeviceEvent> grouping_uploaded_;
};

// The product name of CUDA device `index` (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"). Throws
// zero3::CudaError.
std::string cuda_device_name(int index);

}  // namespace llama3

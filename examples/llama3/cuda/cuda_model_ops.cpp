#include "cuda/cuda_model_ops.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/cuda_ops.hpp"
#ifdef LLAMA3_HAVE_CUDNN
#include "cuda/cudnn_attention.hpp"
#endif
#include "ops/embedding.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace llama3 {
namespace {

using zero3::DType;

cudaStream_t as_cuda(zero3::Stream s) { return static_cast<cudaStream_t>(s); }

cuda::AttentionDims dims(const AttentionShape& s) {
  check_attention_shape(s);
  return {s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim};
}

}  // namespace

CudaModelOps::CudaModelOps(zero3::Device& device, DType act)
    : device_(device), act_(act), stream_(device.default_stream()) {
  if (device.type() != zero3::DeviceType::cuda) {
    throw zero3::InvalidArgument("CudaModelOps: device " + device.name() + " is not a CUDA device");
  }
  if (act != DType::f32 && act != DType::bf16) {
    throw zero3::Unsupported("cuda model ops do not support " + std::string(zero3::dtype_name(act)) +
                             " compute: the Llama-3 CUDA kernels take f32 or bf16 activations (use bf16.enabled or "
                             "fp32 instead of fp16.enabled on " +
                             device.name() + ")");
  }
  LLAMA3_CUDA_CHECK(cudaSetDevice(device.index()));
  // The kernels' scratch (cuBLAS's workspace, attention and loss workspaces, RMSNorm's partial sums) comes from
  // the zero3 device's stream-ordered pool, the one the engine allocates from.
  blas_ = std::make_unique<cuda::Blas>(device);
  attention_ = std::make_unique<cuda::Attention>(*blas_);
#ifdef LLAMA3_HAVE_CUDNN
  if (act == DType::bf16) {
    try {
      cudnn_attention_ = std::make_unique<cuda::CudnnAttention>(
          as_cuda(stream_), cuda::CudnnAttention::Allocator{[this](size_t bytes) { return device_.allocate(bytes); },
                                                            [this](void* p, size_t bytes) { free(p, bytes); }});
    } catch (const zero3::CudaError& e) {
      zero3::log::warn("cuda model ops: cuDNN attention unavailable, attention runs on cuBLAS: ", e.what());
    }
  }
#endif
  lm_head_ = std::make_unique<cuda::LmHeadLoss>(*blas_);
  grouping_uploaded_ = device.make_event();
}

CudaModelOps::~CudaModelOps() {
  if (paths_.fused_forward + paths_.fused_backward + paths_.unfused_forward + paths_.unfused_backward > 0) {
    zero3::log::info("cuda model ops: attention paths (", zero3::dtype_name(act_), ", cuDNN ",
                     cudnn_attention_ ? "loaded" : "not loaded", "): fused forward ", paths_.fused_forward,
                     ", fused backward ", paths_.fused_backward, ", unfused forward ", paths_.unfused_forward,
                     ", unfused backward ", paths_.unfused_backward);
  }
  cudnn_attention_.reset();  // frees its workspace through this object's free()
  free(row_loss_.ptr, row_loss_.bytes);
  free(loss_sum_.ptr, loss_sum_.bytes);
  free(grouping_.ptr, grouping_.bytes);
  if (grouping_host_ != nullptr) {
    try {
      grouping_uploaded_->synchronize();
    } catch (const std::exception& e) {
      zero3::log::warn("cuda model ops: waiting for the last embedding upload failed: ", e.what());
    }
    device_.deallocate_host(grouping_host_, grouping_host_bytes_);
  }
}

std::string CudaModelOps::name() const { return device_.name(); }

void* CudaModelOps::ensure(Scratch& s, size_t bytes) {
  if (bytes > s.bytes) {
    free(s.ptr, s.bytes);
    s = {};
    s.ptr = device_.allocate(bytes);
    s.bytes = bytes;
  }
  return s.ptr;
}

// ---- Memory ----

void* CudaModelOps::allocate(size_t bytes) { return device_.allocate(bytes); }

void CudaModelOps::free(void* ptr, size_t bytes) noexcept {
  if (ptr != nullptr) device_.deallocate_after(ptr, bytes, stream_);
}

void CudaModelOps::zero(void* ptr, size_t bytes) { device_.fill_zero(ptr, bytes, stream_); }

void CudaModelOps::copy(void* dst, const void* src, size_t bytes) { device_.copy(dst, src, bytes, stream_); }

// Without a host wait: the bytes go to pinned staging at once (so host_src may change when this returns), up
// on the stream, and the staging block is reused only once the stream has passed the copy.
void CudaModelOps::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  void* staging = device_.allocate_host(bytes);
  std::memcpy(staging, host_src, bytes);
  try {
    device_.copy(dst, staging, bytes, stream_);
  } catch (...) {
    device_.deallocate_host(staging, bytes);
    throw;
  }
  device_.deallocate_host_after(staging, bytes, stream_);
}

// nullptr: Device::copy's synchronous form (on the compute stream, then a wait).
void CudaModelOps::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  device_.copy(host_dst, src, bytes, nullptr);
}

void CudaModelOps::synchronize() { LLAMA3_CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream_))); }

int64_t CudaModelOps::workspace_bytes() const {
  const int64_t cudnn = cudnn_attention_ ? cudnn_attention_->workspace_bytes() : 0;
  return attention_->workspace_bytes() + cudnn + lm_head_->workspace_bytes() + static_cast<int64_t>(row_loss_.bytes) +
         static_cast<int64_t>(loss_sum_.bytes) + static_cast<int64_t>(grouping_.bytes);
}

// ---- Ops ----

void CudaModelOps::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                        int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, DType c_type) {
  if (c_type != act_ && c_type != DType::f32) {
    throw zero3::Unsupported("cuda model ops do not support a " + std::string(zero3::dtype_name(c_type)) +
                             " GEMM output with " + std::string(zero3::dtype_name(act_)) + " inputs");
  }
  blas_->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, act_, c_type);
}

void CudaModelOps::embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t, int64_t hidden,
                                     void* x) {
  cuda::embedding_forward(ids, tokens, table, hidden, x, act_, as_cuda(stream_));
}

void CudaModelOps::embedding_backward(const int32_t*, const int32_t* host_ids, int64_t tokens, const void* dx,
                                      int64_t vocab, int64_t hidden, float* dtable) {
  if (tokens == 0) return;
  check_token_ids(host_ids, tokens, vocab, "input_ids");
  const cuda::EmbeddingGrouping g = cuda::EmbeddingGrouping::build(host_ids, tokens);
  const size_t n_rows = g.rows.size();
  const size_t bytes = (g.rows.size() + g.offsets.size() + g.token_ids.size()) * sizeof(int32_t);
  // The staging buffer is rewritten only after the previous upload from it (a micro-batch ago) has finished.
  grouping_uploaded_->synchronize();
  if (bytes > grouping_host_bytes_) {
    device_.deallocate_host(grouping_host_, grouping_host_bytes_);
    grouping_host_ = nullptr;
    grouping_host_bytes_ = 0;
    grouping_host_ = device_.allocate_host(bytes);
    grouping_host_bytes_ = bytes;
  }
  int32_t* host = static_cast<int32_t*>(grouping_host_);
  std::memcpy(host, g.rows.data(), g.rows.size() * sizeof(int32_t));
  std::memcpy(host + n_rows, g.offsets.data(), g.offsets.size() * sizeof(int32_t));
  std::memcpy(host + n_rows + g.offsets.size(), g.token_ids.data(), g.token_ids.size() * sizeof(int32_t));
  int32_t* dev = static_cast<int32_t*>(ensure(grouping_, bytes));
  device_.copy(dev, host, bytes, stream_);
  grouping_uploaded_->record(stream_);
  cuda::embedding_backward(dev, dev + n_rows, dev + n_rows + g.offsets.size(), static_cast<int64_t>(n_rows), dx, hidden,
                           dtable, act_, as_cuda(stream_));
}

void CudaModelOps::rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n,
                                   float eps) {
  cuda::rmsnorm_forward(x, w, y, rstd, rows, n, eps, act_, as_cuda(stream_));
}

void CudaModelOps::add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd,
                                       int64_t rows, int64_t n, float eps) {
  cuda::add_rmsnorm_forward(a, b, h, w, y, rstd, rows, n, eps, act_, as_cuda(stream_));
}

void CudaModelOps::rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy,
                                    const void* residual, void* dx, float* dw, int64_t rows, int64_t n) {
  cuda::rmsnorm_backward(x, w, rstd, dy, residual, dx, dw, rows, n, act_, device_);
}

void CudaModelOps::rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                const float* cos, const float* sin) {
  cuda::rope_forward(x, ld, n_tokens, n_heads, head_dim, cos, sin, act_, as_cuda(stream_));
}

void CudaModelOps::rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                 const float* cos, const float* sin) {
  cuda::rope_backward(dx, ld, n_tokens, n_heads, head_dim, cos, sin, act_, as_cuda(stream_));
}

void CudaModelOps::swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter) {
  cuda::swiglu_forward(gu, out, rows, inter, act_, as_cuda(stream_));
}

void CudaModelOps::swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter) {
  cuda::swiglu_backward(gu, dout, dgu, rows, inter, act_, as_cuda(stream_));
}

void CudaModelOps::add(const void* a, const void* b, void* y, int64_t n) {
  cuda::add(a, b, y, n, act_, as_cuda(stream_));
}

void CudaModelOps::convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  if (src_type == DType::f16 || dst_type == DType::f16) {
    throw zero3::Unsupported("cuda model ops do not support converting " + std::string(zero3::dtype_name(src_type)) +
                             " to " + std::string(zero3::dtype_name(dst_type)) +
                             " (the CUDA kernels have f32 and bf16 only)");
  }
  cuda::convert(src, src_type, dst, dst_type, n, as_cuda(stream_));
}

void CudaModelOps::attention_forward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                     const void* v, int64_t ldv, void* out, int64_t ldo, float* lse) {
  if (cudnn_attention_ && cudnn_attention_->forward(dims(s), q, ldq, k, ldk, v, ldv, out, ldo, lse, act_)) {
    ++paths_.fused_forward;
    return;
  }
  attention_->forward(dims(s), q, ldq, k, ldk, v, ldv, out, ldo, lse, act_);
  ++paths_.unfused_forward;
}

void CudaModelOps::attention_backward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                      const void* v, int64_t ldv, const void* out, int64_t ldo, const float* lse,
                                      const void* dout, int64_t lddo, void* dq, int64_t lddq, void* dk, int64_t lddk,
                                      void* dv, int64_t lddv) {
  if (cudnn_attention_ && cudnn_attention_->backward(dims(s), q, ldq, k, ldk, v, ldv, out, ldo, lse, dout, lddo, dq,
                                                     lddq, dk, lddk, dv, lddv, act_)) {
    ++paths_.fused_backward;
    return;
  }
  attention_->backward(dims(s), q, ldq, k, ldk, v, ldv, out, ldo, lse, dout, lddo, dq, lddq, dk, lddk, dv, lddv, act_);
  ++paths_.unfused_backward;
}

int64_t CudaModelOps::lm_head_cross_entropy(const void* x, const void* w, const int32_t* targets,
                                            const int32_t* host_targets, int64_t n, int64_t hidden, int64_t vocab,
                                            float grad_scale, void* dx, float* dw, int64_t chunk_rows) {
  const int64_t count = count_targets(host_targets, n, vocab);
  if (n == 0) return count;
  float* row_loss = static_cast<float*>(ensure(row_loss_, static_cast<size_t>(n) * sizeof(float)));
  lm_head_->run(x, w, targets, n, hidden, vocab, grad_scale, dx, dw, row_loss, chunk_rows, act_);
  double* total = static_cast<double*>(ensure(loss_sum_, sizeof(double)));
  // In row order, in double (the CPU op's sum, chunk by chunk, row by row), onto the sums of the calls before:
  // the first call since a take overwrites whatever the accumulator held.
  if (loss_pending_) {
    cuda::add_rows(row_loss, n, total, as_cuda(stream_));
  } else {
    cuda::sum_rows(row_loss, n, total, as_cuda(stream_));
  }
  loss_pending_ = true;
  return count;
}

double CudaModelOps::take_loss_sum() {
  if (!loss_pending_) return 0.0;
  double total = 0;
  copy_to_host(&total, loss_sum_.ptr, sizeof(double));
  loss_pending_ = false;
  return total;
}

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  LLAMA3_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

}  // namespace llama3

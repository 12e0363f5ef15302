// ModelOps on the host: every op is the ops/*.hpp function llama_model.cpp calls, on float32 host memory, so a
// model run through ModelRunner on this backend gives the same bits as model_forward_backward.
//
// act() is f32 only. gemm takes f32 C only; convert goes between f32 and bf16 or f16 (zero3's rounding) or
// copies. Everything runs in the call (OpenMP threads inside, OpenBLAS through gemm()); memory comes from the
// heap (64-byte aligned), not from a zero3 Device.
#pragma once

#include "backend/model_ops.hpp"

namespace llama3 {

class CpuModelOps final : public ModelOps {
 public:
  CpuModelOps() = default;

  std::string name() const override { return "cpu"; }
  zero3::DType act() const override { return zero3::DType::f32; }

  void* allocate(size_t bytes) override;
  void free(void* ptr, size_t bytes) noexcept override;
  void zero(void* ptr, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override {}
  int64_t workspace_bytes() const override { return 0; }

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

 private:
  double loss_sum_ = 0;  // the loss accumulator
};

}  // namespace llama3

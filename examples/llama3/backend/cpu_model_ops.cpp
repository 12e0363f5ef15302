#include "backend/cpu_model_ops.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/attention.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"
#include "ops/parallel.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/rope.hpp"
#include "ops/swiglu.hpp"
#include "zero3/error.hpp"

namespace llama3 {
namespace {

const float* f(const void* p) { return static_cast<const float*>(p); }
float* f(void* p) { return static_cast<float*>(p); }

[[noreturn]] void unsupported(const std::string& what) {
  throw zero3::Unsupported("cpu model ops do not support " + what);
}

}  // namespace

void* CpuModelOps::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  constexpr size_t kAlign = 64;
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr) {
    throw zero3::Error("cpu model ops: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  }
  return p;
}

void CpuModelOps::free(void* ptr, size_t) noexcept { std::free(ptr); }

void CpuModelOps::zero(void* ptr, size_t bytes) {
  if (bytes > 0) std::memset(ptr, 0, bytes);
}

void CpuModelOps::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void CpuModelOps::copy_from_host(void* dst, const void* host_src, size_t bytes) { copy(dst, host_src, bytes); }

void CpuModelOps::copy_to_host(void* host_dst, const void* src, size_t bytes) { copy(host_dst, src, bytes); }

void CpuModelOps::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                       int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, zero3::DType c_type) {
  if (c_type != zero3::DType::f32) unsupported("a " + std::string(zero3::dtype_name(c_type)) + " GEMM output");
  llama3::gemm<float>(trans_a, trans_b, m, n, k, alpha, f(a), lda, f(b), ldb, beta, f(c), ldc);
}

void CpuModelOps::embedding_forward(const int32_t* ids, int64_t tokens, const void* table, int64_t vocab,
                                    int64_t hidden, void* x) {
  llama3::embedding_forward<float>(ids, tokens, f(table), vocab, hidden, f(x));
}

void CpuModelOps::embedding_backward(const int32_t* ids, const int32_t*, int64_t tokens, const void* dx, int64_t vocab,
                                     int64_t hidden, float* dtable) {
  llama3::embedding_backward<float>(ids, tokens, f(dx), vocab, hidden, dtable);
}

void CpuModelOps::rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n,
                                  float eps) {
  llama3::rmsnorm_forward<float>(f(x), f(w), f(y), rstd, rows, n, eps);
}

void CpuModelOps::add_rmsnorm_forward(const void* a, const void* b, void* h, const void* w, void* y, float* rstd,
                                      int64_t rows, int64_t n, float eps) {
  add(a, b, h, rows * n);
  llama3::rmsnorm_forward<float>(f(h), f(w), f(y), rstd, rows, n, eps);
}

void CpuModelOps::rmsnorm_backward(const void* x, const void* w, const float* rstd, const void* dy,
                                   const void* residual, void* dx, float* dw, int64_t rows, int64_t n) {
  if (residual != nullptr && residual != dx) copy(dx, residual, static_cast<size_t>(rows * n) * sizeof(float));
  llama3::rmsnorm_backward<float>(f(x), f(w), rstd, f(dy), f(dx), dw, rows, n, residual != nullptr);
}

// ops/rope.cpp's loops over raw tables (a RopeTable owns vectors; the runner's tables are backend buffers).
void CpuModelOps::rope_forward(void* x, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                               const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  float* p = f(x);
#pragma omp parallel for schedule(static) if (n_tokens * n_heads * head_dim >= kParallelMinWork)
  for (int64_t r = 0; r < n_tokens; ++r)
    for (int64_t h = 0; h < n_heads; ++h)
      rope_forward_head(p + r * ld + h * head_dim, cos + r * half, sin + r * half, half);
}

void CpuModelOps::rope_backward(void* dx, int64_t ld, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  float* p = f(dx);
#pragma omp parallel for schedule(static) if (n_tokens * n_heads * head_dim >= kParallelMinWork)
  for (int64_t r = 0; r < n_tokens; ++r)
    for (int64_t h = 0; h < n_heads; ++h)
      rope_backward_head(p + r * ld + h * head_dim, cos + r * half, sin + r * half, half);
}

void CpuModelOps::swiglu_forward(const void* gu, void* out, int64_t rows, int64_t inter) {
  llama3::swiglu_forward<float>(f(gu), f(out), rows, inter);
}

void CpuModelOps::swiglu_backward(const void* gu, const void* dout, void* dgu, int64_t rows, int64_t inter) {
  llama3::swiglu_backward<float>(f(gu), f(dout), f(dgu), rows, inter);
}

void CpuModelOps::add(const void* a, const void* b, void* y, int64_t n) {
  const float* pa = f(a);
  const float* pb = f(b);
  float* py = f(y);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
}

void CpuModelOps::convert(const void* src, zero3::DType src_type, void* dst, zero3::DType dst_type, int64_t n) {
  using zero3::DType;
  if (src_type == dst_type) return copy(dst, src, static_cast<size_t>(n) * zero3::dtype_size(src_type));
  if (src_type == DType::f32) {
    const float* s = f(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    const bool bf16 = dst_type == DType::bf16;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) d[i] = bf16 ? zero3::f32_to_bf16(s[i]) : zero3::f32_to_f16(s[i]);
    return;
  }
  if (dst_type == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = f(dst);
    const bool bf16 = src_type == DType::bf16;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) d[i] = bf16 ? zero3::bf16_to_f32(s[i]) : zero3::f16_to_f32(s[i]);
    return;
  }
  unsupported("converting " + std::string(zero3::dtype_name(src_type)) + " to " +
              std::string(zero3::dtype_name(dst_type)));
}

void CpuModelOps::attention_forward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                    const void* v, int64_t ldv, void* out, int64_t ldo, float* lse) {
  llama3::attention_forward<float>(s, AttentionIO<float>{f(q), ldq, f(k), ldk, f(v), ldv}, f(out), ldo, lse);
}

void CpuModelOps::attention_backward(const AttentionShape& s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                                     const void* v, int64_t ldv, const void*, int64_t, const float* lse,
                                     const void* dout, int64_t lddo, void* dq, int64_t lddq, void* dk, int64_t lddk,
                                     void* dv, int64_t lddv) {
  llama3::attention_backward<float>(s, AttentionIO<float>{f(q), ldq, f(k), ldk, f(v), ldv}, lse, f(dout), lddo, f(dq),
                                    lddq, f(dk), lddk, f(dv), lddv);
}

int64_t CpuModelOps::lm_head_cross_entropy(const void* x, const void* w, const int32_t* targets, const int32_t*,
                                           int64_t n, int64_t hidden, int64_t vocab, float grad_scale, void* dx,
                                           float* dw, int64_t chunk_rows) {
  const CrossEntropyResult r =
      llama3::lm_head_cross_entropy<float>(f(x), f(w), targets, n, hidden, vocab, grad_scale, f(dx), dw, chunk_rows);
  loss_sum_ += r.loss_sum;
  return r.count;
}

double CpuModelOps::take_loss_sum() {
  const double total = loss_sum_;
  loss_sum_ = 0;
  return total;
}

}  // namespace llama3

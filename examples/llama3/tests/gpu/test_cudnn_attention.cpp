// cuDNN's fused attention (cuda/cudnn_attention.hpp) against the cuBLAS + kernels path (cuda/attention.cu) and the
// CPU op (ops/attention.hpp), bf16, causal, grouped-query: odd sequence lengths (77, 200), GQA 4/2 and 6/2, MQA 8/1,
// head_dim 16..64, several sequences, row strides with padding columns (multiples of 8 elements, as cuDNN needs 16
// bytes), and one long case (seq 4096) against the cuBLAS path only (the CPU op at 4096 is minutes without BLAS).
//
// Tolerances: outputs and gradients within 2e-2 of each tensor's largest magnitude (the bf16 bound of
// test_cuda_ops: both sides round P, dS and the outputs to bf16, in different orders); the log-sum-exp (f32
// softmax statistics) within 1e-4 relative of the largest. A shape cuDNN is meant to take (unsupported_reason
// empty) must be run by cuDNN: a refused graph is a failure here, not a silent fall back. The plan is built once
// per shape and the forward repeats its bits. Without a GPU the program exits 77 (skipped); in a build without
// cuDNN it says so and exits 77.
#include "gpu/cuda_test_env.hpp"

#if defined(LLAMA3_HAVE_CUDA) && defined(LLAMA3_HAVE_CUDNN)
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "cuda/cudnn_attention.hpp"
#include "ops/attention.hpp"
#include "tests/grad_check.hpp"
#include "zero3/dtype.hpp"

namespace {

using zero3::DType;
namespace lc = llama3::cuda;

constexpr double kBf16Tol = 2e-2;
constexpr double kLseTol = 1e-4;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Buffer {
  explicit Buffer(size_t bytes) {
    cuda_ok(cudaMalloc(&ptr, bytes), "cudaMalloc");
    cuda_ok(cudaMemset(ptr, 0, bytes), "cudaMemset");
  }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* at(int64_t elements, size_t es) const { return static_cast<char*>(ptr) + elements * static_cast<int64_t>(es); }
  void* ptr = nullptr;
};

std::vector<float> bf16_values(size_t n, uint64_t seed) {
  auto v = llama3::testing::random_vector<float>(n, seed, 1.0);
  for (auto& x : v) x = zero3::bf16_to_f32(zero3::f32_to_bf16(x));
  return v;
}

std::unique_ptr<Buffer> upload_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = zero3::f32_to_bf16(v[i]);
  auto b = std::make_unique<Buffer>(h.size() * 2);
  cuda_ok(cudaMemcpy(b->ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
  return b;
}

std::vector<float> download(const void* p, size_t n, DType t) {
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> out(n);
  if (t == DType::f32) {
    cuda_ok(cudaMemcpy(out.data(), p, n * 4, cudaMemcpyDeviceToHost), "download");
  } else {
    std::vector<uint16_t> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), "download");
    for (size_t i = 0; i < n; ++i) out[i] = zero3::bf16_to_f32(h[i]);
  }
  return out;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  for (float g : got)
    if (std::isnan(g)) return INFINITY;
  return llama3::testing::max_rel_diff(got.data(), want.data(), got.size());
}

std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t ld, int64_t c0, int64_t width) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) out.push_back(m[static_cast<size_t>(r * ld + c0 + c)]);
  return out;
}

struct Result {
  std::vector<float> out, lse, grads;  // grads (tokens, ld_g): dq | dk | dv
};

enum class Path { cudnn, cublas };

class Case {
 public:
  Case(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd) : d{batch, seq, heads, kv_heads, hd} {
    qw = heads * hd;
    kw = kv_heads * hd;
    tokens = batch * seq;
    ld_qkv = qw + 2 * kw + 8;
    ldo = qw + 8;
    lddo = qw + 16;
    ld_g = qw + 2 * kw + 8;
    qkv = bf16_values(static_cast<size_t>(tokens * ld_qkv), 71);
    dout = bf16_values(static_cast<size_t>(tokens * lddo), 72);
  }

  Result cpu() const {
    Result r;
    llama3::AttentionShape s{d.batch, d.seq, d.n_heads, d.n_kv_heads, d.head_dim};
    llama3::AttentionIO<float> io{qkv.data(), ld_qkv, qkv.data() + qw, ld_qkv, qkv.data() + qw + kw, ld_qkv};
    r.out.assign(static_cast<size_t>(tokens * ldo), 0.0f);
    r.lse.assign(static_cast<size_t>(d.batch * d.n_heads * d.seq), 0.0f);
    r.grads.assign(static_cast<size_t>(tokens * ld_g), 0.0f);
    llama3::attention_forward<float>(s, io, r.out.data(), ldo, r.lse.data());
    float* g = r.grads.data();
    llama3::attention_backward<float>(s, io, r.lse.data(), dout.data(), lddo, g, ld_g, g + qw, ld_g, g + qw + kw, ld_g);
    return r;
  }

  // One forward and one backward on `path`; with cuDNN, `cudnn` is the object (kept across calls by the caller).
  Result gpu(Path path, lc::CudnnAttention* cudnn, zero3::Device& device) const {
    const cudaStream_t stream = device.default_stream();
    const size_t es = 2;
    auto dqkv = upload_bf16(qkv), ddout = upload_bf16(dout);
    Buffer out(static_cast<size_t>(tokens * ldo) * es), lse(static_cast<size_t>(d.batch * d.n_heads * d.seq) * 4),
        grads(static_cast<size_t>(tokens * ld_g) * es);
    const char* q = dqkv->at(0, es);
    const char* k = dqkv->at(qw, es);
    const char* v = dqkv->at(qw + kw, es);
    if (path == Path::cudnn) {
      const bool fwd = cudnn->forward(d, q, ld_qkv, k, ld_qkv, v, ld_qkv, out.ptr, ldo, static_cast<float*>(lse.ptr),
                                      DType::bf16);
      EXPECT_TRUE(fwd) << "cuDNN refused the forward graph (its warning says why)";
      const std::string why = cudnn->unsupported_reason(d, DType::bf16, true);
      const bool bwd = cudnn->backward(d, q, ld_qkv, k, ld_qkv, v, ld_qkv, out.ptr, ldo, static_cast<float*>(lse.ptr),
                                       ddout->ptr, lddo, grads.at(0, es), ld_g, grads.at(qw, es), ld_g,
                                       grads.at(qw + kw, es), ld_g, DType::bf16);
      EXPECT_EQ(bwd, why.empty()) << "backward: " << (why.empty() ? "cuDNN refused the graph" : why);
      if (!bwd) {  // the shape the model would route to the cuBLAS backward: run it, on cuDNN's forward
        lc::Blas blas(device);
        lc::Attention fallback(blas);
        fallback.backward(d, q, ld_qkv, k, ld_qkv, v, ld_qkv, out.ptr, ldo, static_cast<float*>(lse.ptr), ddout->ptr,
                          lddo, grads.at(0, es), ld_g, grads.at(qw, es), ld_g, grads.at(qw + kw, es), ld_g,
                          DType::bf16);
        cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      }
    } else {
      lc::Blas blas(device);
      lc::Attention attention(blas);
      attention.forward(d, q, ld_qkv, k, ld_qkv, v, ld_qkv, out.ptr, ldo, static_cast<float*>(lse.ptr), DType::bf16);
      attention.backward(d, q, ld_qkv, k, ld_qkv, v, ld_qkv, out.ptr, ldo, static_cast<float*>(lse.ptr), ddout->ptr,
                         lddo, grads.at(0, es), ld_g, grads.at(qw, es), ld_g, grads.at(qw + kw, es), ld_g,
                         DType::bf16);
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    Result r;
    r.out = download(out.ptr, static_cast<size_t>(tokens * ldo), DType::bf16);
    r.lse = download(lse.ptr, static_cast<size_t>(d.batch * d.n_heads * d.seq), DType::f32);
    r.grads = download(grads.ptr, static_cast<size_t>(tokens * ld_g), DType::bf16);
    return r;
  }

  void expect_close(const Result& got, const Result& want, const char* against) const {
    SCOPED_TRACE(std::string("against the ") + against);
    EXPECT_LT(rel_err(columns(got.out, tokens, ldo, 0, qw), columns(want.out, tokens, ldo, 0, qw)), kBf16Tol) << "out";
    EXPECT_LT(rel_err(got.lse, want.lse), kLseTol) << "lse";
    const char* names[] = {"dq", "dk", "dv"};
    const int64_t starts[] = {0, qw, qw + kw}, widths[] = {qw, kw, kw};
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(rel_err(columns(got.grads, tokens, ld_g, starts[i], widths[i]),
                        columns(want.grads, tokens, ld_g, starts[i], widths[i])),
                kBf16Tol)
          << names[i];
    }
    // Padding columns stay 0.
    EXPECT_EQ(columns(got.out, tokens, ldo, qw, 8), std::vector<float>(static_cast<size_t>(tokens * 8), 0.0f));
    EXPECT_EQ(columns(got.grads, tokens, ld_g, qw + 2 * kw, 8),
              std::vector<float>(static_cast<size_t>(tokens * 8), 0.0f));
  }

  lc::AttentionDims d;
  int64_t qw, kw, tokens, ld_qkv, ldo, lddo, ld_g;
  std::vector<float> qkv, dout;
};

class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda_ok(cudaStreamCreate(&stream_), "cudaStreamCreate");
    device_ = zero3::make_device("cuda", stream_);
    cudnn_ = std::make_unique<lc::CudnnAttention>(
        stream_, lc::CudnnAttention::Allocator{[](size_t bytes) {
                                                 void* p = nullptr;
                                                 cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
                                                 return p;
                                               },
                                               [this](void* p, size_t) {
                                                 cudaStreamSynchronize(stream_);
                                                 cudaFree(p);
                                               }});
    std::printf("cuDNN %lld\n", static_cast<long long>(lc::CudnnAttention::version()));
  }
  void TearDown() override {
    cudnn_.reset();
    device_.reset();
    cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<zero3::Device> device_;  // computes on stream_
  std::unique_ptr<lc::CudnnAttention> cudnn_;
};

TEST_F(CudnnAttentionTest, MatchesTheCpuOpAndTheCublasPath) {
  struct Shape {
    int64_t batch, seq, heads, kv_heads, hd;
  };
  for (const Shape s : {Shape{2, 128, 4, 2, 64}, Shape{1, 200, 6, 2, 32}, Shape{3, 77, 8, 1, 16},
                        Shape{1, 256, 4, 4, 128}}) {
    SCOPED_TRACE("batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq) + " heads " +
                 std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " head_dim " + std::to_string(s.hd));
    Case c(s.batch, s.seq, s.heads, s.kv_heads, s.hd);
    const Result got = c.gpu(Path::cudnn, cudnn_.get(), *device_);
    c.expect_close(got, c.cpu(), "CPU op");
    c.expect_close(got, c.gpu(Path::cublas, nullptr, *device_), "cuBLAS path");
  }
}

TEST_F(CudnnAttentionTest, LongSequenceMatchesTheCublasPath) {
  Case c(1, 4096, 8, 2, 64);
  c.expect_close(c.gpu(Path::cudnn, cudnn_.get(), *device_), c.gpu(Path::cublas, nullptr, *device_), "cuBLAS path");
}

TEST_F(CudnnAttentionTest, PlansAreBuiltOncePerShapeAndTheForwardRepeatsItsBits) {
  Case c(2, 128, 4, 2, 64);
  const Result a = c.gpu(Path::cudnn, cudnn_.get(), *device_);
  const int64_t built = cudnn_->plans_built();
  EXPECT_EQ(built, 2) << "one forward and one backward plan";
  const Result b = c.gpu(Path::cudnn, cudnn_.get(), *device_);
  EXPECT_EQ(cudnn_->plans_built(), built);
  EXPECT_EQ(cudnn_->forward_runs(), 2);
  EXPECT_EQ(cudnn_->backward_runs(), 2);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_GT(cudnn_->workspace_bytes(), 0);
}

TEST_F(CudnnAttentionTest, ShapesItDoesNotTakeAreRefusedWithAReason) {
  EXPECT_NE(cudnn_->unsupported_reason({1, 64, 4, 2, 64}, DType::f32, false), "");  // f32: the cuBLAS path
  EXPECT_NE(cudnn_->unsupported_reason({1, 64, 4, 2, 20}, DType::bf16, false), "");  // head_dim not a multiple of 8
  EXPECT_NE(cudnn_->unsupported_reason({1, 1, 4, 2, 64}, DType::bf16, false), "");   // one token
  EXPECT_EQ(cudnn_->unsupported_reason({1, 64, 4, 2, 64}, DType::bf16, false), "");
  // Refused shapes queue nothing and report false.
  EXPECT_FALSE(cudnn_->forward({1, 64, 4, 2, 64}, nullptr, 64, nullptr, 64, nullptr, 64, nullptr, 64, nullptr,
                               DType::f32));
}

}  // namespace

#else

TEST(CudnnAttention, NeedsABuildWithCudnn) {
  zero3::testing_gpu::skip("this build has no cuDNN (ZERO3_CUDNN off or not found) or no CUDA backend");
}

#endif

// Every CUDA op of the Llama-3 example (cuda/cuda_ops.hpp) against the CPU op of ops/ on the same inputs, at odd
// sizes (37 rows, hidden 96, head_dim 16, seq 29, vocab 301, 4 query heads on 2 kv heads, ignored targets,
// strided column blocks with padding that must stay untouched), with rows longer than a block (seq 300, vocab
// 1100, n 1030), attention split into chunks of kv heads by a small workspace cap, and the last partial chunk of
// the LM head loss; and the cross-entropy at Llama-3's vocabulary against a double reference.
//
// Expectations. f32: the CPU result within a few float roundings (relative to the tensor's largest magnitude,
// 1e-5 for single products and row reductions, 1e-4 for the chained attention backward), since only the order
// of the sums differs; copies, conversions, adds and the embedding backward (the same additions in the same
// order) are bit-exact. bf16: inputs are rounded to bf16 first and the CPU op runs in f32 on those values; the
// device rounds its bf16 outputs (and P, dS, dlogits for the GEMMs), so 2e-2 of the largest magnitude. Two
// runs of the same op give the same bits. Without a CUDA device the program prints why and exits 77 (skipped).
#include "gpu/cuda_test_env.hpp"

#if defined(LLAMA3_HAVE_CUDA)

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/lm_head_plan.hpp"
#include "cuda/cuda_ops.hpp"
#include "ops/attention.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/gemm.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/rope.hpp"
#include "ops/swiglu.hpp"
#include "tests/cross_entropy_rows.hpp"
#include "tests/grad_check.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace {

using llama3::testing::max_rel_diff;
using llama3::testing::random_vector;
using zero3::DType;
namespace lc = llama3::cuda;

constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 2e-2;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)), "cudaMalloc");
    cuda_ok(cudaMemset(ptr_, 0, std::max<size_t>(bytes, 1)), "cudaMemset");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// The values as the device sees them in type t (bf16: rounded to nearest even).
std::vector<float> rounded(std::vector<float> v, DType t) {
  if (t == DType::bf16)
    for (auto& x : v) x = zero3::bf16_to_f32(zero3::f32_to_bf16(x));
  return v;
}

std::vector<float> rand_vec(size_t n, uint64_t seed, DType t = DType::f32, double scale = 1.0) {
  return rounded(random_vector<float>(n, seed, scale), t);
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> bytes(v.size() * zero3::dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&bytes[i * 4], &v[i], 4);
    } else {
      const uint16_t h = zero3::f32_to_bf16(v[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

std::unique_ptr<DeviceBuffer> upload(const std::vector<float>& v, DType t) {
  auto bytes = encode(v, t);
  auto buf = std::make_unique<DeviceBuffer>(bytes.size());
  cuda_ok(cudaMemcpy(buf->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
  return buf;
}

std::unique_ptr<DeviceBuffer> upload_ints(const std::vector<int32_t>& v) {
  auto buf = std::make_unique<DeviceBuffer>(v.size() * 4);
  cuda_ok(cudaMemcpy(buf->get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  return buf;
}

std::vector<uint8_t> bytes_of(const void* p, size_t bytes, cudaStream_t stream) {
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<uint8_t> out(bytes);
  cuda_ok(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost), "download");
  return out;
}

std::vector<float> download(const void* p, size_t n, DType t, cudaStream_t stream) {
  auto bytes = bytes_of(p, n * zero3::dtype_size(t), stream);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      out[i] = zero3::bf16_to_f32(h);
    }
  }
  return out;
}

// max |got - want| / max |want|; infinite when got holds a NaN or the sizes differ.
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  for (float g : got)
    if (std::isnan(g)) return INFINITY;
  return max_rel_diff(got.data(), want.data(), got.size());
}

double tol(DType t, double f32_tol = kF32Tol) { return t == DType::f32 ? f32_tol : kBf16Tol; }

// Columns [c0, c0 + width) of a (rows, ld) matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t ld, int64_t c0, int64_t width) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) out.push_back(m[static_cast<size_t>(r * ld + c0 + c)]);
  return out;
}

const DType kActs[] = {DType::f32, DType::bf16};

class CudaOps : public ::testing::Test {
 protected:
  // The ops' scratch comes from a zero3 device computing on the test's stream (the ops run there).
  void SetUp() override {
    cuda_ok(cudaStreamCreate(&stream_), "cudaStreamCreate");
    device_ = zero3::make_device("cuda", stream_);
  }
  void TearDown() override {
    cudaStreamSynchronize(stream_);
    device_.reset();
    cudaStreamDestroy(stream_);
  }
  std::vector<float> get(const DeviceBuffer& b, size_t n, DType t) { return download(b.get(), n, t, stream_); }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<zero3::Device> device_;
};

// ---- GEMM ----

TEST_F(CudaOps, GemmAllTransposesStridesAndTypes) {
  lc::Blas blas(*device_);
  const int64_t m = 37, n = 29, k = 96;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("trans_a ") + (ta ? "1" : "0") + " trans_b " + (tb ? "1" : "0"));
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
      const size_t a_size = static_cast<size_t>((ta ? k : m) * lda), b_size = static_cast<size_t>((tb ? n : k) * ldb);
      const size_t c_size = static_cast<size_t>(m * ldc);
      // f32 -> f32, alpha 0.5, beta 2.
      {
        auto a = rand_vec(a_size, 1), b = rand_vec(b_size, 2), c = rand_vec(c_size, 3);
        auto want = c;
        llama3::gemm_loop<float>(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, want.data(), ldc);
        auto da = upload(a, DType::f32), db = upload(b, DType::f32), dc = upload(c, DType::f32);
        blas.gemm(ta, tb, m, n, k, 0.5f, da->get(), lda, db->get(), ldb, 2.0f, dc->get(), ldc, DType::f32, DType::f32);
        EXPECT_LT(rel_err(get(*dc, c_size, DType::f32), want), kF32Tol) << "f32";
      }
      // bf16 -> f32 (the weight-gradient case: beta 1 accumulates), and bf16 -> bf16 with beta 0.
      {
        auto a = rand_vec(a_size, 4, DType::bf16), b = rand_vec(b_size, 5, DType::bf16), c = rand_vec(c_size, 6);
        auto want = c;
        llama3::gemm_loop<float>(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, want.data(), ldc);
        auto da = upload(a, DType::bf16), db = upload(b, DType::bf16), dc = upload(c, DType::f32);
        blas.gemm(ta, tb, m, n, k, 1.0f, da->get(), lda, db->get(), ldb, 1.0f, dc->get(), ldc, DType::bf16, DType::f32);
        EXPECT_LT(rel_err(get(*dc, c_size, DType::f32), want), 1e-4) << "bf16 -> f32";

        auto c16 = rand_vec(c_size, 7, DType::bf16);
        auto want16 = c16;
        llama3::gemm_loop<float>(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want16.data(), ldc);
        auto dc16 = upload(c16, DType::bf16);
        blas.gemm(ta, tb, m, n, k, 1.0f, da->get(), lda, db->get(), ldb, 0.0f, dc16->get(), ldc, DType::bf16,
                  DType::bf16);
        EXPECT_LT(rel_err(get(*dc16, c_size, DType::bf16), want16), 1e-2) << "bf16 -> bf16";
      }
      // Strided batch of 3, with gaps between the operands.
      {
        const int64_t count = 3, sa = static_cast<int64_t>(a_size) + 7, sb = static_cast<int64_t>(b_size) + 1,
                      sc = static_cast<int64_t>(c_size) + 4;
        auto a = rand_vec(static_cast<size_t>(sa * count), 8), b = rand_vec(static_cast<size_t>(sb * count), 9);
        auto c = rand_vec(static_cast<size_t>(sc * count), 10);
        auto want = c;
        for (int64_t i = 0; i < count; ++i) {
          llama3::gemm_loop<float>(ta, tb, m, n, k, 1.5f, a.data() + i * sa, lda, b.data() + i * sb, ldb, -1.0f,
                                   want.data() + i * sc, ldc);
        }
        auto da = upload(a, DType::f32), db = upload(b, DType::f32), dc = upload(c, DType::f32);
        blas.gemm_strided_batched(ta, tb, m, n, k, 1.5f, da->get(), lda, sa, db->get(), ldb, sb, -1.0f, dc->get(), ldc,
                                  sc, count, DType::f32, DType::f32);
        EXPECT_LT(rel_err(get(*dc, c.size(), DType::f32), want), kF32Tol) << "strided batched";
      }
    }
  }
}

// beta 0 ignores what C held (the attention and loss workspaces are never cleared); k 0 leaves beta * C, with
// A's row stride 0 (A has no columns).
TEST_F(CudaOps, GemmIgnoresCWithBetaZeroAndTakesKZero) {
  lc::Blas blas(*device_);
  const int64_t m = 5, n = 7, k = 3;
  auto a = rand_vec(static_cast<size_t>(m * k), 111), b = rand_vec(static_cast<size_t>(k * n), 112);
  std::vector<float> c(static_cast<size_t>(m * n), NAN), want(c.size());
  llama3::gemm_loop<float>(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, want.data(), n);
  auto da = upload(a, DType::f32), db = upload(b, DType::f32), dc = upload(c, DType::f32);
  blas.gemm(false, false, m, n, k, 1.0f, da->get(), k, db->get(), n, 0.0f, dc->get(), n, DType::f32, DType::f32);
  EXPECT_LT(rel_err(get(*dc, c.size(), DType::f32), want), kF32Tol) << "beta 0 over NaN";

  auto c2 = rand_vec(static_cast<size_t>(m * n), 113);
  std::vector<float> twice(c2.size());
  for (size_t i = 0; i < c2.size(); ++i) twice[i] = 2.0f * c2[i];
  auto dc2 = upload(c2, DType::f32);
  blas.gemm(false, false, m, n, 0, 1.0f, da->get(), 0, db->get(), n, 2.0f, dc2->get(), n, DType::f32, DType::f32);
  EXPECT_EQ(get(*dc2, c2.size(), DType::f32), twice) << "k 0";
}

TEST_F(CudaOps, GemmRejectsUnsupportedTypesAndStrides) {
  lc::Blas blas(*device_);
  DeviceBuffer a(64 * 4), b(64 * 4), c(64 * 4);
  EXPECT_THROW(
      blas.gemm(false, false, 2, 2, 2, 1.0f, a.get(), 2, b.get(), 2, 0.0f, c.get(), 2, DType::f32, DType::bf16),
      zero3::InvalidArgument);
  EXPECT_THROW(blas.gemm(false, false, 2, 2, 2, 1.0f, a.get(), 2, b.get(), 2, 0.0f, c.get(), 2, DType::f16, DType::f16),
               zero3::InvalidArgument);
  EXPECT_THROW(blas.gemm(false, false, 2, 4, 2, 1.0f, a.get(), 2, b.get(), 2, 0.0f, c.get(), 4, DType::f32, DType::f32),
               zero3::InvalidArgument);  // ldb 2 < n 4
}

// ---- RMSNorm ----

TEST_F(CudaOps, RmsNormForwardAndBackward) {
  const float eps = 1e-5f;
  for (DType act : kActs) {
    for (int64_t rows : {int64_t{37}, int64_t{300}}) {
      for (int64_t n : {int64_t{96}, int64_t{1030}}) {
        SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " rows " + std::to_string(rows) + " n " + std::to_string(n));
        const size_t sz = static_cast<size_t>(rows * n);
        auto x = rand_vec(sz, 11, act, 2.0), w = rand_vec(static_cast<size_t>(n), 12, act);
        auto dy = rand_vec(sz, 13, act), dx0 = rand_vec(sz, 14, act);
        auto dw0 = rand_vec(static_cast<size_t>(n), 15, DType::f32, 0.1);
        std::vector<float> y_ref(sz), rstd_ref(static_cast<size_t>(rows));
        llama3::rmsnorm_forward<float>(x.data(), w.data(), y_ref.data(), rstd_ref.data(), rows, n, eps);
        auto dx_ref = dx0, dw_ref = dw0, dx_over = dx0;
        llama3::rmsnorm_backward<float>(x.data(), w.data(), rstd_ref.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                                        rows, n, true);
        llama3::rmsnorm_backward<float>(x.data(), w.data(), rstd_ref.data(), dy.data(), dx_over.data(), nullptr, rows,
                                        n, false);

        auto dxd = upload(x, act), dwd = upload(w, act), ddy = upload(dy, act);
        DeviceBuffer y(sz * zero3::dtype_size(act)), rstd(static_cast<size_t>(rows) * 4);
        lc::rmsnorm_forward(dxd->get(), dwd->get(), y.get(), rstd.as<float>(), rows, n, eps, act, stream_);
        EXPECT_LT(rel_err(get(y, sz, act), y_ref), tol(act)) << "y";
        EXPECT_LT(rel_err(get(rstd, static_cast<size_t>(rows), DType::f32), rstd_ref), kF32Tol) << "rstd";

        // In place (y aliases x).
        auto x_inplace = upload(x, act);
        lc::rmsnorm_forward(x_inplace->get(), dwd->get(), x_inplace->get(), nullptr, rows, n, eps, act, stream_);
        EXPECT_LT(rel_err(get(*x_inplace, sz, act), y_ref), tol(act)) << "y in place";

        // Backward from the CPU's rstd: dx accumulated and dw, then dx overwritten without dw.
        auto rstd_cpu = upload(rstd_ref, DType::f32);
        auto ddx = upload(dx0, act), ddw = upload(dw0, DType::f32);
        lc::rmsnorm_backward(dxd->get(), dwd->get(), rstd_cpu->as<float>(), ddy->get(), ddx->get(), ddx->get(),
                             ddw->as<float>(), rows, n, act, *device_);
        EXPECT_LT(rel_err(get(*ddx, sz, act), dx_ref), tol(act)) << "dx accumulated";
        EXPECT_LT(rel_err(get(*ddw, static_cast<size_t>(n), DType::f32), dw_ref), tol(act)) << "dw";
        // The residual from another buffer: dx = dx0 + the gradient, dx0 untouched.
        auto dres = upload(dx0, act);
        DeviceBuffer dx_res(sz * zero3::dtype_size(act));
        lc::rmsnorm_backward(dxd->get(), dwd->get(), rstd_cpu->as<float>(), ddy->get(), dres->get(), dx_res.get(),
                             nullptr, rows, n, act, *device_);
        EXPECT_LT(rel_err(get(dx_res, sz, act), dx_ref), tol(act)) << "dx = residual + gradient";
        EXPECT_EQ(get(*dres, sz, act), dx0) << "the residual was written";
        lc::rmsnorm_backward(dxd->get(), dwd->get(), rstd_cpu->as<float>(), ddy->get(), nullptr, ddx->get(), nullptr,
                             rows, n, act, *device_);
        EXPECT_LT(rel_err(get(*ddx, sz, act), dx_over), tol(act)) << "dx overwritten";
      }
    }
  }
}

// The 16-byte kernels against the element-by-element ones and the CPU: row lengths that fill whole packs (4 f32,
// 8 bf16), lengths that do not (n % 8 = 4 takes the f32 packs and the bf16 scalar kernel), and pointers one
// element off a 16-byte boundary (the scalar kernel on a vector shape).
TEST_F(CudaOps, RmsNormVectorAndScalarPathsAgree) {
  const float eps = 1e-5f;
  for (DType act : kActs) {
    for (int64_t n : {int64_t{8}, int64_t{20}, int64_t{1003}, int64_t{4096}}) {
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {
        SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " n " + std::to_string(n) + " offset " +
                     std::to_string(offset));
        const int64_t rows = 13;
        const size_t sz = static_cast<size_t>(rows * n), es = zero3::dtype_size(act);
        auto x = rand_vec(sz + offset, 16, act, 2.0), w = rand_vec(static_cast<size_t>(n + offset), 17, act);
        auto dy = rand_vec(sz + offset, 18, act);
        const std::vector<float> xs(x.begin() + offset, x.end()), ws(w.begin() + offset, w.end()),
            dys(dy.begin() + offset, dy.end());
        std::vector<float> y_ref(sz), rstd_ref(static_cast<size_t>(rows)), dx_ref(sz);
        llama3::rmsnorm_forward<float>(xs.data(), ws.data(), y_ref.data(), rstd_ref.data(), rows, n, eps);
        llama3::rmsnorm_backward<float>(xs.data(), ws.data(), rstd_ref.data(), dys.data(), dx_ref.data(), nullptr, rows,
                                        n, false);
        auto dxd = upload(x, act), dwd = upload(w, act), ddy = upload(dy, act);
        DeviceBuffer y((sz + 1) * es), dx((sz + 1) * es), rstd(static_cast<size_t>(rows) * 4);
        auto at = [&](const DeviceBuffer& b) { return static_cast<char*>(b.get()) + offset * es; };
        lc::rmsnorm_forward(at(*dxd), at(*dwd), at(y), rstd.as<float>(), rows, n, eps, act, stream_);
        lc::rmsnorm_backward(at(*dxd), at(*dwd), rstd.as<float>(), at(*ddy), nullptr, at(dx), nullptr, rows, n, act,
                             *device_);
        auto y_got = get(y, sz + offset, act), dx_got = get(dx, sz + offset, act);
        EXPECT_LT(rel_err(std::vector<float>(y_got.begin() + offset, y_got.end()), y_ref), tol(act)) << "y";
        EXPECT_LT(rel_err(get(rstd, static_cast<size_t>(rows), DType::f32), rstd_ref), kF32Tol) << "rstd";
        EXPECT_LT(rel_err(std::vector<float>(dx_got.begin() + offset, dx_got.end()), dx_ref), tol(act)) << "dx";
      }
    }
  }
}

// The residual add fused with the norm: h must be the bits of the add kernel's output (the same rounding), y and
// rstd those of the CPU norm of that h; h may alias a.
TEST_F(CudaOps, AddRmsNormForwardIsTheAddThenTheNorm) {
  const float eps = 1e-5f;
  for (DType act : kActs) {
    for (int64_t n : {int64_t{96}, int64_t{20}, int64_t{1030}}) {
      SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " n " + std::to_string(n));
      const int64_t rows = 37;
      const size_t sz = static_cast<size_t>(rows * n), es = zero3::dtype_size(act);
      auto a = rand_vec(sz, 111, act, 2.0), b = rand_vec(sz, 112, act), w = rand_vec(static_cast<size_t>(n), 113, act);
      auto da = upload(a, act), db = upload(b, act), dw = upload(w, act);
      DeviceBuffer h_add(sz * es), h(sz * es), y(sz * es), rstd(static_cast<size_t>(rows) * 4);
      lc::add(da->get(), db->get(), h_add.get(), static_cast<int64_t>(sz), act, stream_);
      lc::add_rmsnorm_forward(da->get(), db->get(), h.get(), dw->get(), y.get(), rstd.as<float>(), rows, n, eps, act,
                              stream_);
      EXPECT_EQ(bytes_of(h.get(), h.bytes(), stream_), bytes_of(h_add.get(), h_add.bytes(), stream_)) << "h";
      const auto hv = get(h, sz, act);
      std::vector<float> y_ref(sz), rstd_ref(static_cast<size_t>(rows));
      llama3::rmsnorm_forward<float>(hv.data(), w.data(), y_ref.data(), rstd_ref.data(), rows, n, eps);
      EXPECT_LT(rel_err(get(y, sz, act), y_ref), tol(act)) << "y";
      EXPECT_LT(rel_err(get(rstd, static_cast<size_t>(rows), DType::f32), rstd_ref), kF32Tol) << "rstd";
      // h written over a.
      lc::add_rmsnorm_forward(da->get(), db->get(), da->get(), dw->get(), y.get(), nullptr, rows, n, eps, act, stream_);
      EXPECT_EQ(bytes_of(da->get(), da->bytes(), stream_), bytes_of(h_add.get(), h_add.bytes(), stream_)) << "h over a";
    }
  }
}

// ---- RoPE ----

// The q and k heads of a fused projection rotated in one call (the runner's), packed rows (16-byte kernels where
// half fills packs: head_dim 16 and 128) and a head_dim whose half does not (12: 6 pairs), against the CPU op.
TEST_F(CudaOps, RopeOverQAndKHeadsVectorAndScalar) {
  const int64_t tokens = 29;
  for (int64_t hd : {int64_t{12}, int64_t{16}, int64_t{128}}) {
    const int64_t half = hd / 2, heads = 4 + 2, ld = (4 + 2 + 2) * hd;  // q | k | v
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / hd);
    std::vector<int32_t> positions(static_cast<size_t>(tokens));
    for (int64_t r = 0; r < tokens; ++r) positions[r] = static_cast<int32_t>(r);
    auto table = llama3::make_rope_table<float>(inv_freq, positions.data(), tokens);
    auto dcos = upload(table.cos, DType::f32), dsin = upload(table.sin, DType::f32);
    for (DType act : kActs) {
      SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " head_dim " + std::to_string(hd));
      auto x = rand_vec(static_cast<size_t>(tokens * ld), 22, act);
      auto fwd = x, bwd = x;
      llama3::rope_forward<float>(fwd.data(), ld, heads, hd, table);
      llama3::rope_backward<float>(bwd.data(), ld, heads, hd, table);
      auto d1 = upload(x, act), d2 = upload(x, act);
      lc::rope_forward(d1->get(), ld, tokens, heads, hd, dcos->as<float>(), dsin->as<float>(), act, stream_);
      lc::rope_backward(d2->get(), ld, tokens, heads, hd, dcos->as<float>(), dsin->as<float>(), act, stream_);
      EXPECT_LT(rel_err(get(*d1, x.size(), act), fwd), tol(act)) << "forward (v columns unchanged)";
      EXPECT_LT(rel_err(get(*d2, x.size(), act), bwd), tol(act)) << "backward";
    }
  }
}

TEST_F(CudaOps, RopeForwardAndBackwardOnAStridedBlock) {
  const int64_t tokens = 37, heads = 3, hd = 16, half = hd / 2, ld = heads * hd + 5;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / hd);
  std::vector<int32_t> positions(static_cast<size_t>(tokens));
  for (int64_t r = 0; r < tokens; ++r) positions[r] = static_cast<int32_t>((r * 7) % 29);
  auto table = llama3::make_rope_table<float>(inv_freq, positions.data(), tokens);
  auto dcos = upload(table.cos, DType::f32), dsin = upload(table.sin, DType::f32);
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    auto x = rand_vec(static_cast<size_t>(tokens * ld), 21, act);
    auto fwd = x, bwd = x;
    llama3::rope_forward<float>(fwd.data(), ld, heads, hd, table);
    llama3::rope_backward<float>(bwd.data(), ld, heads, hd, table);
    auto d1 = upload(x, act), d2 = upload(x, act);
    lc::rope_forward(d1->get(), ld, tokens, heads, hd, dcos->as<float>(), dsin->as<float>(), act, stream_);
    lc::rope_backward(d2->get(), ld, tokens, heads, hd, dcos->as<float>(), dsin->as<float>(), act, stream_);
    // The padding columns are compared too: they must be unchanged.
    EXPECT_LT(rel_err(get(*d1, x.size(), act), fwd), tol(act)) << "forward";
    EXPECT_LT(rel_err(get(*d2, x.size(), act), bwd), tol(act)) << "backward";
  }
}

// ---- SwiGLU ----

TEST_F(CudaOps, SwigluForwardAndBackward) {
  const int64_t rows = 37;
  for (DType act : kActs) {
    // 96 and 40: 16-byte packs for f32 and bf16; 20: packs for f32 only; 101: element by element.
    for (int64_t inter : {int64_t{96}, int64_t{40}, int64_t{20}, int64_t{101}}) {
      SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " inter " + std::to_string(inter));
      auto gu = rand_vec(static_cast<size_t>(rows * 2 * inter), 31, act, 4.0);
      auto dh = rand_vec(static_cast<size_t>(rows * inter), 32, act);
      std::vector<float> h_ref(dh.size()), dgu_ref(gu.size());
      llama3::swiglu_forward<float>(gu.data(), h_ref.data(), rows, inter);
      llama3::swiglu_backward<float>(gu.data(), dh.data(), dgu_ref.data(), rows, inter);
      auto dgu_in = upload(gu, act), ddh = upload(dh, act);
      DeviceBuffer h(dh.size() * zero3::dtype_size(act)), dgu(gu.size() * zero3::dtype_size(act));
      lc::swiglu_forward(dgu_in->get(), h.get(), rows, inter, act, stream_);
      lc::swiglu_backward(dgu_in->get(), ddh->get(), dgu.get(), rows, inter, act, stream_);
      EXPECT_LT(rel_err(get(h, h_ref.size(), act), h_ref), tol(act)) << "forward";
      EXPECT_LT(rel_err(get(dgu, dgu_ref.size(), act), dgu_ref), tol(act)) << "backward";
    }
  }
}

// ---- Element-wise ----

TEST_F(CudaOps, AddAndConvertAreExact) {
  const int64_t n = 1001;
  auto a = rand_vec(static_cast<size_t>(n), 41, DType::f32, 3.0), b = rand_vec(static_cast<size_t>(n), 42);
  // convert f32 -> bf16 rounds to nearest even, bf16 -> f32 is exact, equal types copy.
  auto da = upload(a, DType::f32);
  DeviceBuffer as16(static_cast<size_t>(n) * 2), back(static_cast<size_t>(n) * 4), copy(static_cast<size_t>(n) * 4);
  lc::convert(da->get(), DType::f32, as16.get(), DType::bf16, n, stream_);
  lc::convert(as16.get(), DType::bf16, back.get(), DType::f32, n, stream_);
  lc::convert(da->get(), DType::f32, copy.get(), DType::f32, n, stream_);
  EXPECT_EQ(bytes_of(as16.get(), as16.bytes(), stream_), encode(a, DType::bf16));
  EXPECT_EQ(get(back, static_cast<size_t>(n), DType::f32), rounded(a, DType::bf16));
  EXPECT_EQ(bytes_of(copy.get(), copy.bytes(), stream_), encode(a, DType::f32));
  EXPECT_THROW(lc::convert(da->get(), DType::f32, as16.get(), DType::f16, n, stream_), zero3::InvalidArgument);

  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    auto ar = rounded(a, act), br = rounded(b, act);
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[i] = ar[i] + br[i];
    auto x = upload(ar, act), y = upload(br, act);
    DeviceBuffer out(static_cast<size_t>(n) * zero3::dtype_size(act));
    lc::add(x->get(), y->get(), out.get(), n, act, stream_);
    EXPECT_EQ(bytes_of(out.get(), out.bytes(), stream_), encode(want, act));
    // One element off a 16-byte boundary: the element-by-element kernel, the same bits.
    DeviceBuffer off(static_cast<size_t>(n + 1) * zero3::dtype_size(act));
    char* off1 = static_cast<char*>(off.get()) + zero3::dtype_size(act);
    lc::add(x->get(), y->get(), off1, n, act, stream_);
    auto off_bytes = bytes_of(off.get(), off.bytes(), stream_);
    EXPECT_EQ(std::vector<uint8_t>(off_bytes.begin() + static_cast<int64_t>(zero3::dtype_size(act)), off_bytes.end()),
              encode(want, act));
    lc::add(x->get(), y->get(), x->get(), n, act, stream_);  // y aliases a
    EXPECT_EQ(bytes_of(x->get(), x->bytes(), stream_), encode(want, act));
  }
  EXPECT_THROW(lc::add(da->get(), da->get(), copy.get(), n, DType::f16, stream_), zero3::InvalidArgument);
}

// ---- Embedding ----

TEST_F(CudaOps, EmbeddingForwardAndBackwardAreExact) {
  const int64_t tokens = 300, vocab = 50, hidden = 96;
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 37 + i / 7) % 47);  // ids 47..49 unused
  auto grouping = lc::EmbeddingGrouping::build(ids.data(), tokens);
  auto dids = upload_ints(ids), drows = upload_ints(grouping.rows), doffsets = upload_ints(grouping.offsets),
       dtoks = upload_ints(grouping.token_ids);
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    auto table = rand_vec(static_cast<size_t>(vocab * hidden), 51, act);
    auto dx = rand_vec(static_cast<size_t>(tokens * hidden), 52, act);
    auto dtable0 = rand_vec(table.size(), 53);
    std::vector<float> x_ref(dx.size());
    llama3::embedding_forward<float>(ids.data(), tokens, table.data(), vocab, hidden, x_ref.data());
    auto dtable_ref = dtable0;
    llama3::embedding_backward<float>(ids.data(), tokens, dx.data(), vocab, hidden, dtable_ref.data());

    auto dt = upload(table, act), ddx = upload(dx, act), ddt = upload(dtable0, DType::f32);
    DeviceBuffer x(dx.size() * zero3::dtype_size(act));
    lc::embedding_forward(dids->as<int32_t>(), tokens, dt->get(), hidden, x.get(), act, stream_);
    EXPECT_EQ(get(x, x_ref.size(), act), x_ref);
    lc::embedding_backward(drows->as<int32_t>(), doffsets->as<int32_t>(), dtoks->as<int32_t>(),
                           static_cast<int64_t>(grouping.rows.size()), ddx->get(), hidden, ddt->as<float>(), act,
                           stream_);
    EXPECT_EQ(get(*ddt, dtable_ref.size(), DType::f32), dtable_ref);  // same additions in the same order
  }
}

// ---- Attention ----

struct AttentionRun {
  std::vector<float> out, lse, grads;  // grads: (tokens, ld_g) holding dq | dk | dv
  int64_t workspace_bytes = 0;
};

class AttentionCase {
 public:
  AttentionCase(DType act, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd)
      : act(act), d{batch, seq, heads, kv_heads, hd} {
    qw = heads * hd;
    kw = kv_heads * hd;
    tokens = batch * seq;
    ld_qkv = qw + 2 * kw + 3;
    ldo = qw + 1;
    lddo = qw + 2;
    ld_g = qw + 2 * kw + 1;
    qkv = rand_vec(static_cast<size_t>(tokens * ld_qkv), 61, act);
    dout = rand_vec(static_cast<size_t>(tokens * lddo), 62, act);
  }

  AttentionRun cpu() const {
    AttentionRun r;
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

  AttentionRun gpu(zero3::Device& device, int64_t workspace_cap = lc::kDefaultAttentionWorkspaceCap) const {
    const auto stream = static_cast<cudaStream_t>(device.default_stream());
    lc::Blas blas(device);
    const int64_t before = device.bytes_in_use();
    lc::Attention attention(blas, workspace_cap);
    const size_t es = zero3::dtype_size(act);
    auto dqkv = upload(qkv, act), ddout = upload(dout, act);
    DeviceBuffer out(static_cast<size_t>(tokens * ldo) * es), lse(static_cast<size_t>(d.batch * d.n_heads * d.seq) * 4),
        grads(static_cast<size_t>(tokens * ld_g) * es);
    auto at = [&](const DeviceBuffer& b, int64_t col) { return static_cast<char*>(b.get()) + col * es; };
    const char* q = static_cast<const char*>(dqkv->get());
    attention.forward(d, q, ld_qkv, q + qw * es, ld_qkv, q + (qw + kw) * es, ld_qkv, out.get(), ldo, lse.as<float>(),
                      act);
    attention.backward(d, q, ld_qkv, q + qw * es, ld_qkv, q + (qw + kw) * es, ld_qkv, out.get(), ldo, lse.as<float>(),
                       ddout->get(), lddo, at(grads, 0), ld_g, at(grads, qw), ld_g, at(grads, qw + kw), ld_g, act);
    EXPECT_GT(attention.workspace_bytes(), 0);
    EXPECT_EQ(device.bytes_in_use() - before, attention.workspace_bytes()) << "the workspace is not the device's";
    AttentionRun r;
    r.workspace_bytes = attention.workspace_bytes();
    r.out = download(out.get(), static_cast<size_t>(tokens * ldo), act, stream);
    r.lse = download(lse.get(), static_cast<size_t>(d.batch * d.n_heads * d.seq), DType::f32, stream);
    r.grads = download(grads.get(), static_cast<size_t>(tokens * ld_g), act, stream);
    return r;
  }

  void expect_close(const AttentionRun& got, const AttentionRun& want) const {
    EXPECT_LT(rel_err(got.out, want.out), tol(act, 5e-5)) << "out";
    EXPECT_LT(rel_err(got.lse, want.lse), kF32Tol) << "lse";
    const char* names[] = {"dq", "dk", "dv"};
    const int64_t starts[] = {0, qw, qw + kw}, widths[] = {qw, kw, kw};
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(rel_err(columns(got.grads, tokens, ld_g, starts[i], widths[i]),
                        columns(want.grads, tokens, ld_g, starts[i], widths[i])),
                tol(act, 1e-4))
          << names[i];
    }
    // The padding column of out and grads stays 0.
    EXPECT_EQ(columns(got.out, tokens, ldo, qw, 1), std::vector<float>(static_cast<size_t>(tokens), 0.0f));
    EXPECT_EQ(columns(got.grads, tokens, ld_g, qw + 2 * kw, 1), std::vector<float>(static_cast<size_t>(tokens), 0.0f));
  }

  DType act;
  lc::AttentionDims d;
  int64_t qw, kw, tokens, ld_qkv, ldo, lddo, ld_g;
  std::vector<float> qkv, dout;
};

TEST_F(CudaOps, AttentionGroupedQueryForwardAndBackward) {
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " GQA 4/2");
    AttentionCase c(act, 2, 29, 4, 2, 16);
    c.expect_close(c.gpu(*device_), c.cpu());
  }
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " MHA 3/3, 1 sequence of 40");
    AttentionCase c(act, 1, 40, 3, 3, 16);
    c.expect_close(c.gpu(*device_), c.cpu());
  }
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " MQA 6/1");
    AttentionCase c(act, 3, 17, 6, 1, 8);
    c.expect_close(c.gpu(*device_), c.cpu());
  }
  // Rows longer than the softmax kernels' block: each thread takes several keys of a row.
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " GQA 4/2, 1 sequence of 300");
    AttentionCase c(act, 1, 300, 4, 2, 8);
    c.expect_close(c.gpu(*device_), c.cpu());
  }
}

// A small workspace cap splits the kv heads into chunks (the last one shorter): per kv head, seq^2 = 841 scores
// take 3364 bytes in f32 forward, 6728 in f32 backward, 5046 in bf16 forward and 10092 in bf16 backward. The caps
// give chunks of 2+1 kv heads (f32 forward at 8000, f32 backward and bf16 forward at 14000, bf16 backward at
// 25000) and of 1+1+1.
TEST_F(CudaOps, AttentionChunksOfKvHeads) {
  for (DType act : kActs) {
    AttentionCase c(act, 2, 29, 6, 3, 8);
    const AttentionRun want = c.cpu();
    const int64_t unchunked = c.gpu(*device_).workspace_bytes;
    for (int64_t cap : {int64_t{8000}, int64_t{14000}, int64_t{25000}}) {
      SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " GQA 6/3, workspace cap " + std::to_string(cap));
      const AttentionRun got = c.gpu(*device_, cap);
      c.expect_close(got, want);
      // The backward's plan is the larger one: the workspace shrinks when the cap splits the backward.
      const int64_t backward_per_kv_head = 29 * 29 * (act == DType::f32 ? 8 : 12);
      if (cap < 3 * backward_per_kv_head) {
        EXPECT_LT(got.workspace_bytes, unchunked) << "the cap did not split the kv heads";
      }
    }
  }
  lc::Blas blas(*device_);
  EXPECT_THROW(lc::Attention(blas, 0), zero3::InvalidArgument);
}

// ---- Cross-entropy with the LM head ----

// vocab 301 fits one pass of the row kernel's 512 threads; 1100 takes three per thread.
TEST_F(CudaOps, LmHeadLossRowsGradientsAndSum) {
  const int64_t n = 37, hidden = 96;
  for (int64_t vocab : {int64_t{301}, int64_t{1100}}) {
    std::vector<int32_t> targets(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      targets[i] = i % 5 == 3 ? llama3::kIgnoreIndex : static_cast<int32_t>((i * 131 + 7) % vocab);
    targets[0] = 0;
    targets[1] = static_cast<int32_t>(vocab - 1);
    const int64_t count = llama3::count_targets(targets.data(), n, vocab);
    const float grad_scale = 1.0f / static_cast<float>(count);
    auto dtargets = upload_ints(targets);
    for (DType act : kActs) {
      auto x = rand_vec(static_cast<size_t>(n * hidden), 71, act),
           w = rand_vec(static_cast<size_t>(vocab * hidden), 72, act);
      auto dw0 = rand_vec(w.size(), 73, DType::f32, 0.01);
      // Reference per-row losses: the CPU op's logits and row function.
      std::vector<float> logits(static_cast<size_t>(n * vocab)), loss_ref(static_cast<size_t>(n));
      llama3::gemm<float>(false, true, n, vocab, hidden, 1.0f, x.data(), hidden, w.data(), hidden, 0.0f, logits.data(),
                          vocab);
      for (int64_t r = 0; r < n; ++r)
        loss_ref[r] = llama3::cross_entropy_row(logits.data() + r * vocab, vocab, targets[r], 1.0f, false);
      auto dx_ref = std::vector<float>(x.size()), dw_ref = dw0;
      const auto result = llama3::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), n, hidden, vocab,
                                                               grad_scale, dx_ref.data(), dw_ref.data(), 16);
      auto dxd = upload(x, act), dwd = upload(w, act);
      for (int64_t chunk : {int64_t{16}, int64_t{0}, int64_t{1000}}) {
        SCOPED_TRACE(std::string(zero3::dtype_name(act)) + " vocab " + std::to_string(vocab) + " chunk_rows " +
                     std::to_string(chunk));
        lc::Blas blas(*device_);
        lc::LmHeadLoss loss(blas);
        auto ddw = upload(dw0, DType::f32);
        DeviceBuffer dx(x.size() * zero3::dtype_size(act)), row_loss(static_cast<size_t>(n) * 4), sum(8);
        loss.run(dxd->get(), dwd->get(), dtargets->as<int32_t>(), n, hidden, vocab, grad_scale, dx.get(),
                 ddw->as<float>(), row_loss.as<float>(), chunk, act);
        lc::sum_rows(row_loss.as<float>(), n, sum.as<double>(), stream_);
        EXPECT_LT(rel_err(get(row_loss, static_cast<size_t>(n), DType::f32), loss_ref),
                  act == DType::f32 ? kF32Tol : 1e-4)
            << "row losses";
        auto sum_bytes = bytes_of(sum.get(), 8, stream_);
        double total;
        std::memcpy(&total, sum_bytes.data(), 8);
        EXPECT_NEAR(total, result.loss_sum, std::fabs(result.loss_sum) * (act == DType::f32 ? 1e-5 : 2e-4)) << "sum";
        EXPECT_LT(rel_err(get(dx, x.size(), act), dx_ref), tol(act)) << "dx";
        EXPECT_LT(rel_err(get(*ddw, w.size(), DType::f32), dw_ref), tol(act)) << "dw";
        EXPECT_GT(loss.workspace_bytes(), 0);
        // The op follows the plan: its dW traffic and its workspace are the plan's.
        const llama3::LmHeadChunkPlan plan =
            llama3::plan_lm_head_chunks(n, hidden, vocab, static_cast<int64_t>(zero3::dtype_size(act)), true, true,
                                        llama3::kDefaultLmHeadWorkspaceCap, chunk);
        EXPECT_EQ(loss.weight_grad_bytes(), plan.weight_grad_bytes);
        EXPECT_EQ(loss.workspace_bytes(), plan.workspace_bytes);

        // Loss only: no gradient, row losses the same.
        DeviceBuffer row_loss2(static_cast<size_t>(n) * 4);
        loss.run(dxd->get(), dwd->get(), dtargets->as<int32_t>(), n, hidden, vocab, grad_scale, nullptr, nullptr,
                 row_loss2.as<float>(), chunk, act);
        EXPECT_EQ(bytes_of(row_loss2.get(), row_loss2.bytes(), stream_),
                  bytes_of(row_loss.get(), row_loss.bytes(), stream_));
      }
    }
  }
}

// The planned chunks under a small workspace cap (several chunks, the last one shorter): the CPU op's numbers, and
// the bytes through dW exactly the plan's (8 * vocab * hidden per chunk), which tests/test_lm_head_plan.cpp bounds.
TEST_F(CudaOps, LmHeadLossPlannedChunksUnderACap) {
  const int64_t n = 1030, hidden = 72, vocab = 1100;
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    targets[i] = i % 7 == 2 ? llama3::kIgnoreIndex : static_cast<int32_t>((i * 37 + 5) % vocab);
  const float grad_scale = 1.0f / static_cast<float>(llama3::count_targets(targets.data(), n, vocab));
  auto dtargets = upload_ints(targets);
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    const int64_t es = static_cast<int64_t>(zero3::dtype_size(act));
    const int64_t cap = 300 * vocab * (4 + (act == DType::f32 ? 0 : es));  // 300 rows: 4 chunks of 258, 258, 258, 256
    const llama3::LmHeadChunkPlan plan = llama3::plan_lm_head_chunks(n, hidden, vocab, es, true, true, cap);
    ASSERT_EQ(plan.chunks, 4);
    auto x = rand_vec(static_cast<size_t>(n * hidden), 121, act),
         w = rand_vec(static_cast<size_t>(vocab * hidden), 122, act);
    std::vector<float> dx_ref(x.size()), dw_ref(w.size(), 0.0f);
    const auto result = llama3::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), n, hidden, vocab,
                                                             grad_scale, dx_ref.data(), dw_ref.data(), 0);
    lc::Blas blas(*device_);
    lc::LmHeadLoss loss(blas, cap);
    auto dxd = upload(x, act), dwd = upload(w, act);
    DeviceBuffer dx(x.size() * static_cast<size_t>(es)), dw(w.size() * 4), row_loss(static_cast<size_t>(n) * 4), sum(8);
    loss.run(dxd->get(), dwd->get(), dtargets->as<int32_t>(), n, hidden, vocab, grad_scale, dx.get(), dw.as<float>(),
             row_loss.as<float>(), 0, act);
    lc::sum_rows(row_loss.as<float>(), n, sum.as<double>(), stream_);
    auto sum_bytes = bytes_of(sum.get(), 8, stream_);
    double total;
    std::memcpy(&total, sum_bytes.data(), 8);
    EXPECT_NEAR(total, result.loss_sum, std::fabs(result.loss_sum) * (act == DType::f32 ? 1e-5 : 2e-4)) << "loss";
    EXPECT_LT(rel_err(get(dx, x.size(), act), dx_ref), tol(act)) << "dx";
    EXPECT_LT(rel_err(get(dw, w.size(), DType::f32), dw_ref), tol(act)) << "dw";
    EXPECT_EQ(loss.weight_grad_bytes(), plan.weight_grad_bytes);
    EXPECT_EQ(loss.weight_grad_bytes(), 4 * 8 * vocab * hidden);
    EXPECT_EQ(loss.workspace_bytes(), plan.workspace_bytes);
    EXPECT_LE(loss.workspace_bytes(), cap + 256);
  }
  lc::Blas blas(*device_);
  EXPECT_THROW(lc::LmHeadLoss(blas, 0), zero3::InvalidArgument);
}

// Llama-3's vocabulary (128,256), on the rows of tests/cross_entropy_rows.hpp (a trained model's confident, unsure
// and certain rows, a near-uniform one, a wrong one, an ignored one): each row's loss and every element of its
// gradient within 1e-6 relative of the compensated double reference, and of the CPU op (test_ops.cpp holds that
// one to the same). The logits are exactly the rows' values: hidden = rows and x = I, so logits = the columns of
// w^T (products by 1 and 0), and dw = dlogits^T (one product by 1 per element) shows the kernel's gradient as it
// wrote it. bf16: the row losses of the bf16-rounded logits (the kernel computes in f32 and double either way).
TEST_F(CudaOps, LmHeadLossAccurateAtLlama3VocabularyAgainstDoubleAndTheCpuOp) {
  using llama3::testing::max_elementwise_rel;
  const auto rows = llama3::testing::llm_like_rows(llama3::testing::kLlama3Vocab, 2024);
  const int64_t n = rows.rows, hidden = rows.rows, vocab = rows.vocab;
  const float scale = 1.0f / 3;
  auto dtargets = upload_ints(rows.targets);
  std::vector<float> x(static_cast<size_t>(n * hidden), 0.0f);
  for (int64_t i = 0; i < n; ++i) x[i * hidden + i] = 1.0f;
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    llama3::testing::CrossEntropyRows c = rows;
    c.logits = rounded(c.logits, act);
    const auto ref = llama3::testing::cross_entropy_reference(c, scale);
    std::vector<float> cpu = c.logits;  // the CPU op's gradient, in place
    std::vector<double> cpu_loss(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r)
      cpu_loss[r] = llama3::cross_entropy_row<float>(cpu.data() + r * vocab, vocab, c.targets[r], scale, true);
    std::vector<float> w(static_cast<size_t>(vocab * hidden));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < vocab; ++j) w[j * hidden + r] = c.logits[r * vocab + j];
    auto dxd = upload(x, act), dwd = upload(w, act);
    lc::Blas blas(*device_);
    lc::LmHeadLoss loss(blas);
    DeviceBuffer dx(x.size() * zero3::dtype_size(act)), dw(w.size() * 4), row_loss(static_cast<size_t>(n) * 4);
    loss.run(dxd->get(), dwd->get(), dtargets->as<int32_t>(), n, hidden, vocab, scale, dx.get(), dw.as<float>(),
             row_loss.as<float>(), 0, act);
    const auto losses = get(row_loss, static_cast<size_t>(n), DType::f32);
    const auto dlogits_t = get(dw, w.size(), DType::f32);  // (vocab, rows)
    double worst_loss = 0, worst_grad = 0;
    for (int64_t r = 0; r < n; ++r) {
      SCOPED_TRACE(c.kinds[r]);
      const double want = ref.loss[r];
      const double err = want == 0 ? std::fabs(losses[r]) : std::fabs(losses[r] - want) / want;
      const double vs_cpu = want == 0 ? std::fabs(losses[r]) : std::fabs(losses[r] - cpu_loss[r]) / want;
      EXPECT_LE(err, 1e-6) << "loss " << losses[r] << " vs " << want;
      EXPECT_LE(vs_cpu, 1e-6) << "loss " << losses[r] << " vs the CPU op's " << cpu_loss[r];
      worst_loss = std::max(worst_loss, err);
      if (act != DType::f32) continue;  // a bf16 act rounds the gradient to bf16 for the GEMMs
      std::vector<float> g(static_cast<size_t>(vocab));
      std::vector<double> cpu_g(static_cast<size_t>(vocab));
      for (int64_t j = 0; j < vocab; ++j) g[j] = dlogits_t[j * hidden + r], cpu_g[j] = cpu[r * vocab + j];
      const double grad_err = max_elementwise_rel(g.data(), ref.grad.data() + r * vocab, vocab);
      EXPECT_LE(grad_err, 1e-6) << "gradient";
      EXPECT_LE(max_elementwise_rel(g.data(), cpu_g.data(), vocab), 1e-6) << "gradient vs the CPU op's";
      worst_grad = std::max(worst_grad, grad_err);
    }
    std::printf("[%s] vocabulary %lld on the GPU: worst loss error %.2g, worst gradient element error %.2g relative\n",
                std::string(zero3::dtype_name(act)).c_str(), static_cast<long long>(vocab), worst_loss, worst_grad);
  }
}

// Row 0 has a valid target; row 1 targets vocab and row 2 targets -1 (outside the vocabulary: NaN loss, zero
// gradient, as cuda_ops.hpp says); row 3 is ignored (loss 0, zero gradient). dx and dw hold row 0's share only.
TEST_F(CudaOps, LmHeadLossInvalidAndIgnoredTargets) {
  const int64_t n = 4, hidden = 40, vocab = 301;
  const std::vector<int32_t> targets = {5, static_cast<int32_t>(vocab), -1, llama3::kIgnoreIndex};
  auto dtargets = upload_ints(targets);
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    auto x = rand_vec(static_cast<size_t>(n * hidden), 91, act),
         w = rand_vec(static_cast<size_t>(vocab * hidden), 92, act);
    // The reference: row 0 alone.
    std::vector<float> dx_ref(static_cast<size_t>(hidden)), dw_ref(w.size(), 0.0f);
    const auto result = llama3::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), 1, hidden, vocab, 0.5f,
                                                             dx_ref.data(), dw_ref.data(), 0);
    lc::Blas blas(*device_);
    lc::LmHeadLoss loss(blas);
    auto dxd = upload(x, act), dwd = upload(w, act);
    DeviceBuffer dx(x.size() * zero3::dtype_size(act)), dw(w.size() * 4), row_loss(static_cast<size_t>(n) * 4);
    loss.run(dxd->get(), dwd->get(), dtargets->as<int32_t>(), n, hidden, vocab, 0.5f, dx.get(), dw.as<float>(),
             row_loss.as<float>(), 3, act);  // chunks of 3 and 1 rows
    const auto losses = get(row_loss, static_cast<size_t>(n), DType::f32);
    EXPECT_NEAR(losses[0], result.loss_sum, std::fabs(result.loss_sum) * 1e-4);
    EXPECT_TRUE(std::isnan(losses[1])) << losses[1];
    EXPECT_TRUE(std::isnan(losses[2])) << losses[2];
    EXPECT_EQ(losses[3], 0.0f);
    const auto dx_got = get(dx, x.size(), act);
    EXPECT_LT(rel_err(std::vector<float>(dx_got.begin(), dx_got.begin() + hidden), dx_ref), tol(act)) << "dx row 0";
    EXPECT_EQ(std::vector<float>(dx_got.begin() + hidden, dx_got.end()),
              std::vector<float>(static_cast<size_t>((n - 1) * hidden), 0.0f))
        << "dx of rows 1..3";
    EXPECT_LT(rel_err(get(dw, w.size(), DType::f32), dw_ref), tol(act)) << "dw";
  }
}

double read_double(const DeviceBuffer& b, cudaStream_t stream) {
  auto bytes = bytes_of(b.get(), 8, stream);
  double v;
  std::memcpy(&v, bytes.data(), 8);
  return v;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// sum_rows is the host's row-order loop in double, bit for bit, at odd row counts and over several tiles of the
// kernel (1024 rows each); whatever out held before is overwritten.
TEST_F(CudaOps, SumRowsIsTheHostRowOrderSumBitForBit) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1003}, int64_t{4099}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto values = rand_vec(static_cast<size_t>(n), 101 + static_cast<uint64_t>(n), DType::f32, 5.0);
    double want = 0;
    for (float v : values) want += static_cast<double>(v);
    auto dvalues = upload(values, DType::f32);
    const double garbage = 12345.0;
    DeviceBuffer out(8);
    cuda_ok(cudaMemcpy(out.get(), &garbage, 8, cudaMemcpyHostToDevice), "upload");
    lc::sum_rows(dvalues->as<float>(), n, out.as<double>(), stream_);
    const double got = read_double(out, stream_);
    EXPECT_TRUE(same_bits(got, want)) << got << " vs " << want;
  }
}

// add_rows, the LM head's deferred loss: several micro-batches of odd row counts summed on the device into one
// accumulator, with no read in between, equal the host's `total += (row-order sum of the micro-batch)` bit for bit.
TEST_F(CudaOps, AddRowsAccumulatesMicroBatchesAsTheHostWould) {
  const std::vector<int64_t> rows = {1, 7, 1003, 7, 2049};
  DeviceBuffer total(8);
  std::vector<std::unique_ptr<DeviceBuffer>> kept;  // alive until the stream has read them
  double want = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    // Row losses: non-negative, spanning magnitudes (a confident row's 1e-6 beside an unsure row's 10).
    auto values = rand_vec(static_cast<size_t>(rows[k]), 300 + k, DType::f32, 1.0);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::fabs(values[i]) * (i % 5 == 0 ? 1e-6f : 10.0f);
    double s = 0;
    for (float v : values) s += static_cast<double>(v);
    want += s;
    kept.push_back(upload(values, DType::f32));
    if (k == 0) {
      lc::sum_rows(kept.back()->as<float>(), rows[k], total.as<double>(), stream_);
    } else {
      lc::add_rows(kept.back()->as<float>(), rows[k], total.as<double>(), stream_);
    }
  }
  const double got = read_double(total, stream_);
  EXPECT_TRUE(same_bits(got, want)) << got << " vs " << want;
}

// ---- Determinism ----

TEST_F(CudaOps, TwoRunsGiveTheSameBits) {
  for (DType act : kActs) {
    SCOPED_TRACE(std::string(zero3::dtype_name(act)));
    AttentionCase c(act, 2, 29, 4, 2, 16);
    const AttentionRun a = c.gpu(*device_), b = c.gpu(*device_);
    EXPECT_EQ(encode(a.out, act), encode(b.out, act));
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(encode(a.grads, act), encode(b.grads, act));

    const int64_t rows = 300, n = 96;
    auto x = rand_vec(static_cast<size_t>(rows * n), 81, act), w = rand_vec(static_cast<size_t>(n), 82, act);
    auto dy = rand_vec(x.size(), 83, act);
    auto dxd = upload(x, act), dwd = upload(w, act), ddy = upload(dy, act);
    std::vector<std::vector<uint8_t>> dws;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer rstd(static_cast<size_t>(rows) * 4), y(x.size() * zero3::dtype_size(act)),
          dx(x.size() * zero3::dtype_size(act)), dw(static_cast<size_t>(n) * 4);
      lc::rmsnorm_forward(dxd->get(), dwd->get(), y.get(), rstd.as<float>(), rows, n, 1e-5f, act, stream_);
      lc::rmsnorm_backward(dxd->get(), dwd->get(), rstd.as<float>(), ddy->get(), nullptr, dx.get(), dw.as<float>(),
                           rows, n, act, *device_);
      dws.push_back(bytes_of(dw.get(), dw.bytes(), stream_));
    }
    EXPECT_EQ(dws[0], dws[1]);
  }
}

TEST_F(CudaOps, UnsupportedTypesAndShapesAreNamed) {
  DeviceBuffer buf(1024);
  try {
    lc::rmsnorm_forward(buf.get(), buf.get(), buf.get(), nullptr, 2, 4, 1e-5f, DType::f16, stream_);
    FAIL() << "f16 accepted";
  } catch (const zero3::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm_forward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lc::rope_forward(buf.get(), 8, 2, 1, 7, buf.as<float>(), buf.as<float>(), DType::f32, stream_),
               zero3::InvalidArgument);  // odd head_dim
  EXPECT_THROW(lc::rmsnorm_backward(buf.get(), buf.get(), nullptr, buf.get(), nullptr, buf.get(), nullptr, 2, 4,
                                    DType::f32, *device_),
               zero3::InvalidArgument);  // no rstd
  lc::Blas blas(*device_);
  lc::Attention attention(blas);
  lc::AttentionDims d{1, 4, 3, 2, 8};  // 2 kv heads do not divide 3 heads
  EXPECT_THROW(
      attention.forward(d, buf.get(), 64, buf.get(), 64, buf.get(), 64, buf.get(), 64, buf.as<float>(), DType::f32),
      zero3::InvalidArgument);
  // No rows: nothing queued, nothing thrown.
  lc::swiglu_forward(nullptr, nullptr, 0, 96, DType::bf16, stream_);
  lc::embedding_forward(nullptr, 0, nullptr, 96, nullptr, DType::f32, stream_);
}

}  // namespace

#endif  // LLAMA3_HAVE_CUDA

// Every element kernel of the cuda backend against the cpu backend, which runs the same single-source
// element functions in OpenMP loops. Sizes are odd (1, 7, 16385, 1000003, ...) so tails, partial chunks and
// partial Philox blocks are all exercised.
//
// Expectations: the same bits, element by element, for casts, scale, accumulate, Adam/AdamW with its 16-bit
// copies and the zeros/ones/constant/uniform fills (the kernels are compiled without FMA contraction; see
// src/device/cuda/cuda_kernels.hpp). NaN results must be NaN on both sides but may carry different payloads
// (x86 keeps an operand's payload, CUDA returns its canonical NaN). The sum of squares is the same double
// (same chunking, same order of additions). The normal fill uses double log/sin/cos, whose last bit may differ
// between glibc and CUDA's math library: there every element must be within 1 ulp (float) and nearly all
// identical.
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/cuda_stream.hpp"
#include "device/device_kernels.hpp"
#include "zero3/dtype.hpp"

namespace zero3 {
namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};
const int64_t kSizes[] = {1, 7, 33, 1000, 16383, 16385, 1000003};

// Host bytes of n elements of type t from floats (the dtype.hpp conversions: the reference rounding).
std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      uint16_t h = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

float element(const std::vector<uint8_t>& bytes, DType t, size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

uint64_t f64_bits_of(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

uint32_t element_bits(const std::vector<uint8_t>& bytes, DType t, size_t i) {
  if (t == DType::f32) {
    uint32_t u;
    std::memcpy(&u, &bytes[i * 4], 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return h;
}

// Values that stress the conversions: wide magnitudes (f16 overflow and subnormals), exact rounding ties
// of bf16 and f16, f32 subnormals, and (with `specials`) arbitrary bit patterns, so Inf and NaN too.
std::vector<float> make_values(size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng();
    uint32_t kind = static_cast<uint32_t>(r % 10);
    uint32_t bits = static_cast<uint32_t>(r >> 32);
    float x;
    if (kind < 6) {
      int e = static_cast<int>((r >> 8) % 60) - 30;
      x = std::ldexp(1.0f + static_cast<float>((r >> 16) & 0xffff) / 65536.0f, e);
    } else if (kind == 6) {
      x = f32_from_bits((bits & 0xffff0000u) | 0x8000u);  // a bf16 tie
      if (!std::isfinite(x)) x = 1.5f;
    } else if (kind == 7) {
      // An f16 tie: an f16 normal's f32 bits plus half an f16 ulp.
      uint16_t h = static_cast<uint16_t>(bits & 0x7bffu);
      if ((h & 0x7c00u) == 0) h |= 0x0400u;
      x = f32_from_bits(f32_bits(f16_to_f32(h)) | 0x1000u);
    } else if (kind == 8) {
      x = std::ldexp(static_cast<float>(bits & 0xffff), -40);  // f16 subnormals and below
    } else {
      x = specials ? f32_from_bits(bits) : f32_from_bits(bits & 0x807fffffu);  // f32 subnormals when finite-only
    }
    v[i] = (r & 1) ? -x : x;
  }
  return v;
}

class GpuBuffer {
 public:
  GpuBuffer(Device& d, size_t bytes) : d_(d), bytes_(bytes), ptr_(d.allocate(bytes)) {}
  GpuBuffer(Device& d, const std::vector<uint8_t>& host) : GpuBuffer(d, host.size()) { upload(host); }
  ~GpuBuffer() { d_.deallocate(ptr_, bytes_); }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const std::vector<uint8_t>& host) { d_.copy(ptr_, host.data(), host.size()); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> host(bytes_);
    d_.copy(host.data(), ptr_, bytes_);
    return host;
  }

 private:
  Device& d_;
  size_t bytes_;
  void* ptr_;
};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Same bits, or NaN on both sides. Reports the first differences.
::testing::AssertionResult same_elements(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got, DType t,
                                         const std::string& what) {
  size_t n = want.size() / dtype_size(t);
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    uint32_t a = element_bits(want, t, i), b = element_bits(got, t, i);
    if (a == b) continue;
    float fa = element(want, t, i), fb = element(got, t, i);
    if (std::isnan(fa) && std::isnan(fb)) continue;
    if (bad++ < 3) {
      char line[200];
      std::snprintf(line, sizeof line, " [%zu] cpu %.9g (0x%x) cuda %.9g (0x%x);", i, fa, a, fb, b);
      first += line;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << n << " elements differ:" << first;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_device();
    gpu_ = make_device("cuda");
  }
  std::unique_ptr<Device> cpu_;
  std::unique_ptr<Device> gpu_;
};

TEST_F(CudaKernelsTest, DeviceIdentity) {
  EXPECT_EQ(gpu_->type(), DeviceType::cuda);
  EXPECT_EQ(gpu_->index(), 0);
  EXPECT_EQ(gpu_->name(), "cuda:0");
  EXPECT_EQ(make_device("cuda:0")->name(), "cuda:0");
  EXPECT_EQ(make_device("auto")->type(), DeviceType::cuda);
  try {
    make_device("cuda:4096");
    FAIL() << "cuda:4096 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:4096: this machine has"), std::string::npos) << e.what();
  }
}

TEST_F(CudaKernelsTest, CopyMoveFill) {
  const size_t n = 1000003;
  std::vector<float> v = make_values(n, 1, true);
  GpuBuffer a(*gpu_, as_bytes(v));
  GpuBuffer b(*gpu_, n * 4);
  gpu_->copy(b.data(), a.data(), n * 4);  // device to device
  EXPECT_EQ(b.download(), as_bytes(v));
  // Overlapping moves, both directions, by one element and by a large odd distance.
  for (size_t shift : {size_t{1}, size_t{4099}}) {
    std::vector<float> fwd(v);
    std::memmove(fwd.data(), fwd.data() + shift, (n - shift) * 4);
    a.upload(as_bytes(v));
    gpu_->move(a.data(), a.as<float>() + shift, (n - shift) * 4);
    EXPECT_EQ(a.download(), as_bytes(fwd)) << "move down by " << shift;
    std::vector<float> back(v);
    std::memmove(back.data() + shift, back.data(), (n - shift) * 4);
    a.upload(as_bytes(v));
    gpu_->move(a.as<float>() + shift, a.data(), (n - shift) * 4);
    EXPECT_EQ(a.download(), as_bytes(back)) << "move up by " << shift;
  }
  a.upload(as_bytes(v));
  gpu_->fill_zero(a.as<float>() + 3, (n - 10) * 4);
  std::vector<float> want = v;
  std::fill(want.begin() + 3, want.begin() + 3 + (n - 10), 0.0f);
  EXPECT_EQ(a.download(), as_bytes(want));
}

TEST_F(CudaKernelsTest, ScaleCopyAndCastsMatchCpu) {
  for (int64_t n : kSizes) {
    std::vector<float> v = make_values(static_cast<size_t>(n), 100 + n, true);
    for (DType s : kTypes) {
      std::vector<uint8_t> src = encode(v, s);
      GpuBuffer gsrc(*gpu_, src);
      for (DType d : kTypes) {
        for (float scale : {1.0f, 0.37f, 0x1p-10f, -3.0f}) {
          std::vector<uint8_t> want(static_cast<size_t>(n) * dtype_size(d));
          detail::kernels_of(*cpu_).scale_copy(want.data(), d, src.data(), s, scale, n);
          GpuBuffer gdst(*gpu_, want.size());
          detail::kernels_of(*gpu_).scale_copy(gdst.data(), d, gsrc.data(), s, scale, n);
          EXPECT_TRUE(same_elements(want, gdst.download(), d,
                                    "scale_copy " + std::string(dtype_name(s)) + "->" + std::string(dtype_name(d)) +
                                        " scale " + std::to_string(scale) + " n " + std::to_string(n)));
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, ScaleAddMatchesCpu) {
  for (int64_t n : kSizes) {
    std::vector<float> x = make_values(static_cast<size_t>(n), 200 + n, true);
    std::vector<float> acc = make_values(static_cast<size_t>(n), 300 + n, true);
    for (DType s : kTypes) {
      std::vector<uint8_t> src = encode(x, s);
      GpuBuffer gsrc(*gpu_, src);
      for (DType d : kTypes) {
        for (float scale : {1.0f, 0.25f, -0.7f}) {
          std::vector<uint8_t> want = encode(acc, d);
          GpuBuffer gdst(*gpu_, want);
          detail::kernels_of(*cpu_).scale_add(want.data(), d, src.data(), s, scale, n);
          detail::kernels_of(*gpu_).scale_add(gdst.data(), d, gsrc.data(), s, scale, n);
          EXPECT_TRUE(same_elements(want, gdst.download(), d,
                                    "scale_add " + std::string(dtype_name(s)) + "->" + std::string(dtype_name(d)) +
                                        " scale " + std::to_string(scale) + " n " + std::to_string(n)));
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, GradStatsSameDoubleAsCpu) {
  std::vector<int64_t> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back((int64_t{1} << 14) * 37);      // whole chunks only
  sizes.push_back((int64_t{1} << 14) * 70 + 5);  // more chunks than one warp holds, partial last chunk
  for (int64_t n : sizes) {
    std::vector<float> v = make_values(static_cast<size_t>(n), 400 + n, false);
    for (DType t : kTypes) {
      std::vector<uint8_t> x = encode(v, t);
      GpuBuffer gx(*gpu_, x);
      detail::GradStats want = detail::kernels_of(*cpu_).grad_stats(x.data(), t, n);
      detail::GradStats got = detail::kernels_of(*gpu_).grad_stats(gx.data(), t, n);
      EXPECT_EQ(got.non_finite, want.non_finite) << dtype_name(t) << " n " << n;
      EXPECT_EQ(f64_bits_of(got.sum_squares), f64_bits_of(want.sum_squares))
          << dtype_name(t) << " n " << n << ": cpu " << want.sum_squares << " cuda " << got.sum_squares;
    }
  }
}

TEST_F(CudaKernelsTest, GradStatsCountsInfAndNaN) {
  const int64_t n = 1000003;
  std::vector<float> v = make_values(static_cast<size_t>(n), 7, false);
  v[0] = INFINITY;
  v[16384] = -INFINITY;
  v[500000] = NAN;
  v[n - 1] = NAN;
  for (DType t : kTypes) {
    std::vector<uint8_t> x = encode(v, t);
    GpuBuffer gx(*gpu_, x);
    detail::GradStats want = detail::kernels_of(*cpu_).grad_stats(x.data(), t, n);
    detail::GradStats got = detail::kernels_of(*gpu_).grad_stats(gx.data(), t, n);
    // f16 also overflows the largest planted finite values to Inf.
    EXPECT_GE(want.non_finite, 4);
    EXPECT_EQ(got.non_finite, want.non_finite) << dtype_name(t);
    EXPECT_TRUE(std::isnan(got.sum_squares)) << dtype_name(t);
  }
}

TEST_F(CudaKernelsTest, AdamMatchesCpuBitForBit) {
  for (int64_t n : kSizes) {
    const size_t un = static_cast<size_t>(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p(un), m(un), v(un), g(un);
    for (size_t i = 0; i < un; ++i) {
      p[i] = normal(rng) * 0.05f;
      m[i] = normal(rng) * 1e-3f;
      v[i] = std::abs(normal(rng)) * 1e-5f;
    }
    for (bool adamw : {true, false}) {
      for (bool bias_correction : {true, false}) {
        for (auto [with_copy, copy] : {std::pair{false, DType::f32}, std::pair{true, DType::f32},
                                       std::pair{true, DType::bf16}, std::pair{true, DType::f16}}) {
          {
            AdamHyper h;
            h.lr = 3e-4f;
            h.weight_decay = 0.01f;
            h.adam_w_mode = adamw;
            h.bias_correction = bias_correction;
            std::vector<float> cp(p), cm(m), cv(v);
            std::vector<uint8_t> ccopy(un * dtype_size(copy));
            GpuBuffer gp(*gpu_, as_bytes(p)), gm(*gpu_, as_bytes(m)), gv(*gpu_, as_bytes(v)), gg(*gpu_, un * 4),
                gcopy(*gpu_, ccopy.size());
            for (int64_t step = 1; step <= 3; ++step) {
              for (size_t i = 0; i < un; ++i) g[i] = normal(rng) * 0.1f;
              if (un > 3) g[3] = 0.0f;
              gg.upload(as_bytes(g));
              AdamStepConsts c = adam_step_consts(h, step);
              detail::kernels_of(*cpu_).adam(cp.data(), g.data(), cm.data(), cv.data(), n, c,
                                             with_copy ? ccopy.data() : nullptr, copy);
              detail::kernels_of(*gpu_).adam(gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(), n, c,
                                             with_copy ? gcopy.data() : nullptr, copy);
            }
            std::string what = std::string(adamw ? "adamw" : "adam") + (bias_correction ? " bc" : " no-bc") + " n " +
                               std::to_string(n);
            EXPECT_TRUE(same_elements(as_bytes(cp), gp.download(), DType::f32, what + " p"));
            EXPECT_TRUE(same_elements(as_bytes(cm), gm.download(), DType::f32, what + " m"));
            EXPECT_TRUE(same_elements(as_bytes(cv), gv.download(), DType::f32, what + " v"));
            if (with_copy) {
              EXPECT_TRUE(
                  same_elements(ccopy, gcopy.download(), copy, what + " copy " + std::string(dtype_name(copy))));
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, InitFillMatchesCpu) {
  const FillSpec specs[] = {FillSpec::zeros(),           FillSpec::ones(),
                            FillSpec::constant(0.1),     FillSpec::uniform(-0.05, 0.05),
                            FillSpec::normal(0.0, 0.02), FillSpec::normal(1.0, 3.0)};
  const std::pair<int64_t, int64_t> ranges[] = {{0, 1}, {3, 10}, {5, 5}, {0, 1000003}, {1, 1000004}, {999, 16385}};
  for (const FillSpec& spec : specs) {
    for (auto [begin, end] : ranges) {
      const size_t n = static_cast<size_t>(end - begin);
      std::vector<float> want(n);
      detail::kernels_of(*cpu_).init_fill(want.data(), spec, 1234, philox_stream_id("layers.3.mlp.w1"), begin, end);
      GpuBuffer out(*gpu_, std::max<size_t>(n, 1) * 4);
      detail::kernels_of(*gpu_).init_fill(out.as<float>(), spec, 1234, philox_stream_id("layers.3.mlp.w1"), begin, end);
      std::vector<uint8_t> got = out.download();
      got.resize(n * 4);
      std::string what = "fill kind " + std::to_string(static_cast<int>(spec.kind)) + " [" + std::to_string(begin) +
                         ", " + std::to_string(end) + ")";
      if (spec.kind != FillKind::normal) {
        EXPECT_TRUE(same_elements(as_bytes(want), got, DType::f32, what));
        continue;
      }
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) {
        float a = want[i], b = element(got, DType::f32, i);
        if (a == b) continue;
        ++differ;
        EXPECT_EQ(std::nextafter(a, b), b) << what << " element " << begin + static_cast<int64_t>(i)
                                           << " more than 1 ulp apart: cpu " << a << " cuda " << b;
      }
      EXPECT_LE(differ, n / 100000 + 2) << what << ": " << differ << " of " << n << " elements differ by 1 ulp";
    }
  }
  EXPECT_THROW(detail::kernels_of(*gpu_).init_fill(nullptr, FillSpec::ones(), 1, 2, 5, 4), InvalidArgument);
}

TEST_F(CudaKernelsTest, KernelsRunOnTheGivenStream) {
  // Work is queued on a user stream, behind a host function that holds the stream until released: the
  // results appear only after the stream runs, and synchronizing that stream alone is enough to see them.
  auto* cuda = dynamic_cast<detail::CudaDevice*>(gpu_.get());
  ASSERT_NE(cuda, nullptr);
  detail::CudaStream stream(0);
  const int64_t n = 1000003;
  std::vector<float> v = make_values(static_cast<size_t>(n), 9, false);
  GpuBuffer src(*gpu_, as_bytes(v)), dst(*gpu_, static_cast<size_t>(n) * 2);
  gpu_->fill_zero(dst.data(), static_cast<size_t>(n) * 2);
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  };
  ASSERT_EQ(cudaLaunchHostFunc(stream.get(), hold, &release), cudaSuccess);
  detail::kernels_of(*gpu_).scale_copy(dst.data(), DType::bf16, src.data(), DType::f32, 0.5f, n, stream.stream());
  std::vector<uint8_t> early(static_cast<size_t>(n) * 2);
  ASSERT_EQ(cudaMemcpy(early.data(), dst.data(), early.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(early, std::vector<uint8_t>(early.size(), 0)) << "the kernel ran before its stream reached it";
  release = true;
  stream.synchronize();
  std::vector<uint8_t> want(static_cast<size_t>(n) * 2);
  detail::kernels_of(*cpu_).scale_copy(want.data(), DType::bf16, v.data(), DType::f32, 0.5f, n);
  EXPECT_TRUE(same_elements(want, dst.download(), DType::bf16, "scale_copy on a user stream"));
  // grad_stats on the user stream waits for that stream's earlier work.
  ASSERT_EQ(cudaLaunchHostFunc(stream.get(), hold, &release), cudaSuccess);  // released already: passes
  detail::GradStats got = detail::kernels_of(*gpu_).grad_stats(dst.data(), DType::bf16, n, stream.stream());
  detail::GradStats ref = detail::kernels_of(*cpu_).grad_stats(want.data(), DType::bf16, n);
  EXPECT_EQ(got.sum_squares, ref.sum_squares);
}

}  // namespace
}  // namespace zero3

#else

TEST(CudaKernels, NotInThisBuild) {}

#endif

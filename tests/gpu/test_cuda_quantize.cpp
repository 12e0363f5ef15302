// Block quantization on the cuda device against the cpu device, which runs the same element functions
// (src/kernels/block_quantize.hpp) in its scalar reference and SIMD bodies: messages byte for byte (codes,
// padding, scales, NaN scales included), dequantized values and fp32 sums bit for bit, except that a NaN
// may carry another payload on the GPU (CUDA returns its canonical NaN for 0 * NaN). Odd sizes, partial
// blocks, int4 messages ending on half a byte, Inf/NaN, zero and subnormal blocks, a grid too small for
// one warp per block (the grid-stride loop), work queued on a user stream, and argument errors.
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/device_kernels.hpp"
#include "kernels/block_quantize.hpp"
#include "zero3/dtype.hpp"

namespace zero3 {
namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Random bit patterns (Inf, NaN, subnormals), wide magnitudes, zero blocks and blocks of one value, in the
// bytes of type t.
std::vector<uint8_t> hostile_bytes(int64_t n, int64_t block, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(t));
  int kind = 0;
  float magnitude = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % block == 0) {
      kind = static_cast<int>(rng() % 8);
      magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
    }
    float x;
    switch (kind) {
      case 0:
        x = f32_from_bits(static_cast<uint32_t>(rng()));
        break;
      case 1:
        x = 0.0f;
        break;
      case 2:
        x = magnitude;
        break;
      case 3:
        x = f32_from_bits(static_cast<uint32_t>(rng()) & 0x807fffffu);
        break;
      default:
        x = normal(rng) * magnitude;
    }
    if (t == DType::f32) {
      std::memcpy(&out[static_cast<size_t>(i) * 4], &x, 4);
    } else {
      uint16_t h = t == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
      std::memcpy(&out[static_cast<size_t>(i) * 2], &h, 2);
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

::testing::AssertionResult same_elements(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got, DType t,
                                         const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  const size_t size = dtype_size(t);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size() / size; ++i) {
    if (std::memcmp(&want[i * size], &got[i * size], size) == 0) continue;
    float a = element(want, t, i), b = element(got, t, i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (bad++ < 3) first += " [" + std::to_string(i) + "] cpu " + std::to_string(a) + " cuda " + std::to_string(b);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " elements differ:" << first;
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                                      const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure() << what << ": byte " << i << " of " << want.size() << " is 0x" << std::hex
                                           << int(got[i]) << " on cuda, 0x" << int(want[i]) << " on cpu";
    }
  }
  return ::testing::AssertionSuccess();
}

class GpuBuffer {
 public:
  GpuBuffer(Device& d, size_t bytes) : d_(d), bytes_(bytes), ptr_(d.allocate(bytes)) {}
  GpuBuffer(Device& d, const std::vector<uint8_t>& host) : GpuBuffer(d, host.size()) {
    d_.copy(ptr_, host.data(), host.size());
  }
  ~GpuBuffer() { d_.deallocate(ptr_, bytes_); }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  void* data() const { return ptr_; }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> host(bytes_);
    d_.copy(host.data(), ptr_, bytes_);
    return host;
  }
  void fill(uint8_t byte) {
    std::vector<uint8_t> host(bytes_, byte);
    d_.copy(ptr_, host.data(), bytes_);
  }

 private:
  Device& d_;
  size_t bytes_;
  void* ptr_;
};

class CudaQuantizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_device();
    gpu_ = make_device("cuda");
    stream_ = gpu_->make_stream();
  }

  // Quantizes on both devices (the cuda one on a user stream) and compares the messages; then dequantizes
  // the cpu messages on both, to every type and as a sum, and compares those.
  void compare(const std::vector<uint8_t>& x, DType t, int64_t chunk, int64_t chunks, QuantFormat f) {
    const std::string what = "int" + std::to_string(f.bits) + " " + std::string(dtype_name(t)) + " block " +
                             std::to_string(f.block) + " chunk " + std::to_string(chunk) + " x " +
                             std::to_string(chunks);
    const size_t bytes = static_cast<size_t>(chunks * quant_message_bytes(chunk, f));
    std::vector<uint8_t> want(bytes, 0xab);
    detail::kernels_of(*cpu_).quantize(want.data(), x.data(), t, chunk, chunks, f);
    GpuBuffer in(*gpu_, x);
    GpuBuffer messages(*gpu_, bytes);
    messages.fill(0xab);  // padding must be written, not left over
    detail::kernels_of(*gpu_).quantize(messages.data(), in.data(), t, chunk, chunks, f, stream_->get());
    stream_->synchronize();
    ASSERT_TRUE(same_bytes(want, messages.download(), what));

    GpuBuffer cpu_messages(*gpu_, want);
    for (DType out : kTypes) {
      const size_t out_bytes = static_cast<size_t>(chunk * chunks) * dtype_size(out);
      std::vector<uint8_t> back(out_bytes);
      detail::kernels_of(*cpu_).dequantize(back.data(), out, want.data(), chunk, chunks, f);
      GpuBuffer gpu_back(*gpu_, out_bytes);
      detail::kernels_of(*gpu_).dequantize(gpu_back.data(), out, cpu_messages.data(), chunk, chunks, f, stream_->get());
      stream_->synchronize();
      ASSERT_TRUE(
          same_elements(back, gpu_back.download(), out, what + " dequantized to " + std::string(dtype_name(out))));
    }
    std::vector<uint8_t> sum(static_cast<size_t>(chunk) * 4);
    detail::kernels_of(*cpu_).dequantize_sum(reinterpret_cast<float*>(sum.data()), want.data(), chunk, chunks, f);
    GpuBuffer gpu_sum(*gpu_, sum.size());
    detail::kernels_of(*gpu_).dequantize_sum(static_cast<float*>(gpu_sum.data()), cpu_messages.data(), chunk, chunks, f,
                                   stream_->get());
    stream_->synchronize();
    ASSERT_TRUE(same_elements(sum, gpu_sum.download(), DType::f32, what + " summed"));
  }

  std::unique_ptr<Device> cpu_;
  std::unique_ptr<Device> gpu_;
  std::unique_ptr<DeviceStream> stream_;
};

TEST_F(CudaQuantizeTest, SameMessagesAndValuesAsTheCpu) {
  uint64_t seed = 1;
  for (int bits : {8, 4}) {
    for (DType t : kTypes) {
      for (int64_t block : {2, 14, 34, 64, 2048}) {
        for (int64_t chunk : {1, 17, 4097, 70001}) {
          const int64_t chunks = chunk > 10000 ? 1 : 3;
          compare(hostile_bytes(chunk * chunks, block, t, seed++), t, chunk, chunks, QuantFormat{bits, block});
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(CudaQuantizeTest, MoreBlocksThanTheGridHasWarps) {
  // blocks_for caps a grid at 2^21 blocks of 8 warps: 2^24 warps. Blocks of two elements then need more
  // than one pass of the grid-stride loop over 40M elements.
  const int64_t n = 40000000;
  compare(hostile_bytes(n, 2, DType::bf16, 99), DType::bf16, n, 1, QuantFormat{8, 2});
}

TEST_F(CudaQuantizeTest, KernelsRunOnTheGivenStream) {
  // The stream is held by a host function: nothing is written until it is released, and synchronizing that
  // stream alone is enough to see the result.
  const int64_t n = 100000;
  QuantFormat f{4, 256};
  std::vector<uint8_t> x = hostile_bytes(n, 256, DType::f32, 5);
  std::vector<uint8_t> want(static_cast<size_t>(quant_message_bytes(n, f)));
  detail::kernels_of(*cpu_).quantize(want.data(), x.data(), DType::f32, n, 1, f);
  GpuBuffer in(*gpu_, x);
  GpuBuffer out(*gpu_, want.size());
  out.fill(0);
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  };
  ASSERT_EQ(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream_->get()), hold, &release), cudaSuccess);
  detail::kernels_of(*gpu_).quantize(out.data(), in.data(), DType::f32, n, 1, f, stream_->get());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(out.download(), std::vector<uint8_t>(want.size(), 0)) << "the kernel ran before its stream reached it";
  release = true;
  stream_->synchronize();
  EXPECT_TRUE(same_bytes(want, out.download(), "quantize on a user stream"));
}

TEST_F(CudaQuantizeTest, BadArgumentsAreRefusedBeforeLaunch) {
  GpuBuffer buf(*gpu_, 64);
  EXPECT_THROW(detail::kernels_of(*gpu_).quantize(buf.data(), buf.data(), DType::f32, 4, 1, QuantFormat{3, 16}), InvalidArgument);
  EXPECT_THROW(detail::kernels_of(*gpu_).dequantize(buf.data(), DType::f32, buf.data(), 4, 1, QuantFormat{4, 5}),
               InvalidArgument);
  EXPECT_THROW(detail::kernels_of(*gpu_).dequantize_sum(static_cast<float*>(buf.data()), buf.data(), 4, -2, QuantFormat{8, 16}),
               InvalidArgument);
}

}  // namespace
}  // namespace zero3

#endif  // ZERO3_HAVE_CUDA

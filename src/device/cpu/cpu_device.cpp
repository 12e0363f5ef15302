// The host-memory device: 64-byte aligned allocations and the engine's kernels as OpenMP loops over the
// single-source element functions.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "device/device_registry.hpp"
#include "kernels/block_quantize_cpu.hpp"
#include "kernels/elementwise.hpp"
#include "offload/cpu_adam.hpp"
#include "zero3/device.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

// Below this many elements a loop finishes faster than a thread team starts.
constexpr int64_t kParallelMin = int64_t{1} << 15;
// Chunk of the deterministic sum of squares: the chunk sums are added in order.
constexpr int64_t kStatsChunk = int64_t{1} << 14;
constexpr size_t kAlignment = 64;

template <DType D, DType S>
void scale_copy_loop(void* dst, const void* src, float scale, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) scale_copy_element<D, S>(dst, src, scale, i);
}

template <DType D, DType S>
void scale_add_loop(void* dst, const void* src, float scale, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) scale_add_element<D, S>(dst, src, scale, i);
}

template <template <DType, DType> class Op, typename... Args>
void dispatch2(DType d, DType s, Args... args) {
  auto with_src = [&]<DType D>() {
    switch (s) {
      case DType::f32:
        Op<D, DType::f32>::run(args...);
        return;
      case DType::bf16:
        Op<D, DType::bf16>::run(args...);
        return;
      case DType::f16:
        Op<D, DType::f16>::run(args...);
        return;
    }
  };
  switch (d) {
    case DType::f32:
      with_src.template operator()<DType::f32>();
      return;
    case DType::bf16:
      with_src.template operator()<DType::bf16>();
      return;
    case DType::f16:
      with_src.template operator()<DType::f16>();
      return;
  }
}

template <DType D, DType S>
struct ScaleCopyOp {
  static void run(void* dst, const void* src, float scale, int64_t n) { scale_copy_loop<D, S>(dst, src, scale, n); }
};
template <DType D, DType S>
struct ScaleAddOp {
  static void run(void* dst, const void* src, float scale, int64_t n) { scale_add_loop<D, S>(dst, src, scale, n); }
};

template <DType T>
detail::GradStats stats_loop(const void* x, int64_t n) {
  int64_t chunks = (n + kStatsChunk - 1) / kStatsChunk;
  std::vector<double> sums(static_cast<size_t>(chunks), 0.0);
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t begin = c * kStatsChunk;
    int64_t end = begin + kStatsChunk < n ? begin + kStatsChunk : n;
    double s = 0.0;
    int64_t b = 0;
    for (int64_t i = begin; i < end; ++i) {
      float v = load_as_f32<T>(x, i);
      b += non_finite_f32(v) ? 1 : 0;
      double d = static_cast<double>(v);
      s += d * d;
    }
    sums[static_cast<size_t>(c)] = s;
    bad += b;
  }
  detail::GradStats out;
  for (double s : sums) out.sum_squares += s;
  out.non_finite = bad;
  return out;
}

class CpuKernels final : public detail::DeviceKernels {
 public:
  void scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n, Stream) override {
    if (n <= 0) return;
    if (dst == src && dst_type == src_type && scale == 1.0f) return;
    if (dst_type == src_type && scale == 1.0f) {
      std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dst_type));
      return;
    }
    dispatch2<ScaleCopyOp>(dst_type, src_type, dst, src, scale, n);
  }

  void scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n, Stream) override {
    if (n <= 0) return;
    dispatch2<ScaleAddOp>(dst_type, src_type, dst, src, scale, n);
  }

  detail::GradStats grad_stats(const void* x, DType type, int64_t n, Stream) override {
    if (n <= 0) return {};
    switch (type) {
      case DType::f32:
        return stats_loop<DType::f32>(x, n);
      case DType::bf16:
        return stats_loop<DType::bf16>(x, n);
      case DType::f16:
        return stats_loop<DType::f16>(x, n);
    }
    return {};
  }

  void accumulate_grad_stats(const void* x, DType type, int64_t n, double* acc, Stream stream) override {
    const detail::GradStats s = grad_stats(x, type, n, stream);
    acc[0] += s.sum_squares;
    acc[1] += static_cast<double>(s.non_finite);
  }

  void grad_stats_to_f32(const double* acc, float* out, Stream) override { grad_stats_f32(acc, out); }

  void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
            DType copy_type, Stream) override {
    if (n <= 0) return;
    cpu_adam_step(p, g, m, v, static_cast<size_t>(n), c, copy_out, copy_type);
  }

  void init_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin, int64_t end,
                 Stream) override {
    philox_fill_cpu(spec, seed, param_stream, begin, end, out);
  }

  void quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                Stream) override {
    quantize_cpu(dst, src, src_type, chunk, chunks, f);
  }

  void dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                  Stream) override {
    dequantize_cpu(dst, dst_type, src, chunk, chunks, f);
  }

  void dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                      Stream) override {
    dequantize_sum_cpu(dst, src, chunk, chunks, f);
  }
};

// Host memory. Freed blocks are kept by size (up to kCachePerSize of each) and handed out again: the
// engine allocates and frees the same sizes every micro-step (gathered units, gradient buffers), and a
// fresh multi-megabyte allocation costs a page fault per 4 KiB on first touch.
class CpuDevice final : public detail::DeviceBackend {
 public:
  ~CpuDevice() override { trim(); }

  DeviceType type() const override { return DeviceType::cpu; }
  int index() const override { return 0; }
  std::string name() const override { return "cpu"; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = take_cached(rounded);
    if (p == nullptr) p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      trim();
      p = std::aligned_alloc(kAlignment, rounded);
    }
    if (p == nullptr) {
      throw Error(log::concat("cpu device: cannot allocate ", bytes, " bytes of host memory (", in_use_.load(),
                              " bytes already allocated by zero3 on this device)"));
    }
    int64_t now = in_use_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }

  void deallocate(void* ptr, size_t bytes) noexcept override {
    if (ptr == nullptr) return;
    in_use_.fetch_sub(static_cast<int64_t>(bytes));
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto& list = cache_[rounded];
      if (list.size() < kCachePerSize) {
        list.push_back(ptr);
        return;
      }
    }
    std::free(ptr);
  }

  void copy(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void move(void* dst, const void* src, size_t bytes, Stream) override {
    if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* ptr, size_t bytes, Stream) override {
    if (bytes != 0) std::memset(ptr, 0, bytes);
  }
  void synchronize() override {}

  int64_t bytes_in_use() const override { return in_use_.load(); }
  int64_t peak_bytes_in_use() const override { return peak_.load(); }

  detail::DeviceKernels& kernels() override { return kernels_; }

 private:
  static constexpr size_t kCachePerSize = 4;

  void* take_cached(size_t rounded) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(rounded);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }

  void trim() noexcept {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (auto& [size, list] : cache_) {
      for (void* p : list) std::free(p);
    }
    cache_.clear();
  }

  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
  std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
  CpuKernels kernels_;
};

const detail::DeviceRegistrar kCpuRegistrar("cpu", [](int, Stream compute_stream) -> std::unique_ptr<Device> {
  ZERO3_REQUIRE(compute_stream == nullptr, InvalidArgument,
                "make_device: the cpu device has no streams; a compute stream is for a cuda device");
  return std::make_unique<CpuDevice>();
});

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

}  // namespace zero3

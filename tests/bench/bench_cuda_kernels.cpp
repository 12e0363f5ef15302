// Bandwidth of the cuda backend's element kernels against the device's own copy bandwidth, both measured
// in this run: a device-to-device cudaMemcpy of the same size moves every byte once in and once out, which
// is what a memory-bound element kernel can at best do. Each line prints the bytes a kernel must move per
// element (reads + writes), its time, GB/s and the ratio to the copy.
//
//   bench_cuda_kernels [--elements N] [--reps R]     (default N = 2^28, R = 20)
//
// Exits 77 with the reason when there is no CUDA device (or no CUDA in this build).
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --elements 65536 --reps 2
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "bench/bench_main.hpp"
#include "zero3/build_config.hpp"

#if ZERO3_HAVE_CUDA

#include <cuda_runtime.h>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/cuda_stream.hpp"
#include "device/cuda_report.hpp"
#include "device/device_kernels.hpp"

using namespace zero3;
using namespace zero3::detail;

namespace {

struct Options {
  int64_t elements = int64_t{1} << 28;
  int reps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--elements" && i + 1 < argc) {
      o.elements = std::strtoll(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      o.reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--elements N] [--reps R]\n", argv[0]);
      std::exit(2);
    }
  }
  if (o.elements < 1024 || o.reps < 1) {
    std::fprintf(stderr, "--elements must be at least 1024 and --reps at least 1\n");
    std::exit(2);
  }
  return o;
}

// Milliseconds per call of `fn` (queued on `stream`), averaged over `reps` calls after one warm-up call.
double time_ms(CudaStream& stream, int reps, const std::function<void()>& fn) {
  CudaEvent start(stream.device(), true), stop(stream.device(), true);
  fn();
  stream.synchronize();
  start.record(stream.get());
  for (int r = 0; r < reps; ++r) fn();
  stop.record(stream.get());
  stop.synchronize();
  return static_cast<double>(stop.elapsed_ms(start)) / reps;
}

// For calls that wait for their stream themselves (grad_stats): host wall time.
double wall_ms(int reps, const std::function<void()>& fn) {
  fn();
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("skipped: no CUDA device: %s\n", why.c_str());
    return 77;
  }
  CudaDevice device(0);
  CudaStream stream(0);
  Stream s = stream.stream();
  DeviceKernels& k = device.kernels();
  const int64_t n = opt.elements;
  const size_t f32_bytes = static_cast<size_t>(n) * 4;
  CudaReport report = query_cuda();
  std::printf("device: %s (cc %d.%d, %d SMs, %.1f GiB), CUDA runtime %s, driver %s\n", device.properties().name,
              device.properties().major, device.properties().minor, device.properties().multiProcessorCount,
              static_cast<double>(device.properties().totalGlobalMem) / (1 << 30),
              cuda_version_string(report.runtime_version).c_str(), cuda_version_string(report.driver_version).c_str());
  std::printf("elements per buffer: %lld (%.2f GiB as f32), %d timed calls each\n\n", static_cast<long long>(n),
              static_cast<double>(f32_bytes) / (1 << 30), opt.reps);

  auto* p = static_cast<float*>(device.allocate(f32_bytes));
  auto* g = static_cast<float*>(device.allocate(f32_bytes));
  auto* m = static_cast<float*>(device.allocate(f32_bytes));
  auto* v = static_cast<float*>(device.allocate(f32_bytes));
  void* half = device.allocate(static_cast<size_t>(n) * 2);
  const uint64_t seed = 42;
  k.init_fill(p, FillSpec::normal(0.0, 0.02), seed, 1, 0, n, s);
  k.init_fill(g, FillSpec::normal(0.0, 1e-3), seed, 2, 0, n, s);
  k.init_fill(m, FillSpec::zeros(), seed, 3, 0, n, s);
  k.init_fill(v, FillSpec::zeros(), seed, 4, 0, n, s);
  k.scale_copy(half, DType::bf16, p, DType::f32, 1.0f, n, s);
  stream.synchronize();

  const double copy_ms = time_ms(stream, opt.reps, [&] {
    if (cudaMemcpyAsync(g, p, f32_bytes, cudaMemcpyDeviceToDevice, stream.get()) != cudaSuccess) std::abort();
  });
  k.init_fill(g, FillSpec::normal(0.0, 1e-3), seed, 2, 0, n, s);
  const double copy_gbs = 2.0 * static_cast<double>(f32_bytes) / (copy_ms * 1e6);
  std::printf("%-38s %6s %10s %10s %8s\n", "operation", "B/elem", "ms/call", "GB/s", "vs copy");
  std::printf("%-38s %6d %10.3f %10.1f %8.2f\n", "cudaMemcpy device-to-device (bound)", 8, copy_ms, copy_gbs, 1.0);

  auto line = [&](const char* name, int bytes_per_elem, double ms) {
    double gbs = static_cast<double>(bytes_per_elem) * static_cast<double>(n) / (ms * 1e6);
    std::printf("%-38s %6d %10.3f %10.1f %8.2f\n", name, bytes_per_elem, ms, gbs, gbs / copy_gbs);
  };
  AdamHyper h;
  h.weight_decay = 0.01f;
  AdamStepConsts c = adam_step_consts(h, 10);

  line("scale_copy f32 -> bf16 (cast)", 6,
       time_ms(stream, opt.reps, [&] { k.scale_copy(half, DType::bf16, p, DType::f32, 1.0f, n, s); }));
  line("scale_copy bf16 -> f32 (cast)", 6,
       time_ms(stream, opt.reps, [&] { k.scale_copy(m, DType::f32, half, DType::bf16, 1.0f, n, s); }));
  line("scale_copy f32 -> f32, x0.5 (scale)", 8,
       time_ms(stream, opt.reps, [&] { k.scale_copy(m, DType::f32, p, DType::f32, 0.5f, n, s); }));
  line("scale_add f32 += bf16 (grad accumulate)", 10,
       time_ms(stream, opt.reps, [&] { k.scale_add(m, DType::f32, half, DType::bf16, 0.25f, n, s); }));
  line("scale_add f32 += f32", 12,
       time_ms(stream, opt.reps, [&] { k.scale_add(m, DType::f32, g, DType::f32, 0.25f, n, s); }));
  k.init_fill(m, FillSpec::zeros(), seed, 3, 0, n, s);
  line("grad_stats f32 (sum of squares, NaN/Inf)", 4, wall_ms(opt.reps, [&] { k.grad_stats(g, DType::f32, n, s); }));
  line("grad_stats bf16", 2, wall_ms(opt.reps, [&] { k.grad_stats(half, DType::bf16, n, s); }));
  line("adam (fp32 p, g, m, v)", 28,
       time_ms(stream, opt.reps, [&] { k.adam(p, g, m, v, n, c, nullptr, DType::f32, s); }));
  line("adam + bf16 copy-out", 30, time_ms(stream, opt.reps, [&] { k.adam(p, g, m, v, n, c, half, DType::bf16, s); }));
  line("init_fill uniform (Philox)", 4,
       time_ms(stream, opt.reps, [&] { k.init_fill(m, FillSpec::uniform(-1, 1), seed, 5, 0, n, s); }));
  line("init_fill normal (Philox, Box-Muller)", 4,
       time_ms(stream, opt.reps, [&] { k.init_fill(m, FillSpec::normal(0, 1), seed, 5, 0, n, s); }));

  for (void* b : {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m), static_cast<void*>(v)}) {
    device.deallocate(b, f32_bytes);
  }
  device.deallocate(half, static_cast<size_t>(n) * 2);
  std::printf("\nB/elem: bytes each kernel must read and write per element; GB/s = B/elem * elements / time.\n");
  std::printf("grad_stats is timed on the host: it includes copying the chunk sums back and waiting for them.\n");
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

#else

int main() {
  std::printf("skipped: this build of zero3 has no CUDA backend (ZERO3_CUDA off or not found)\n");
  return 77;
}

#endif

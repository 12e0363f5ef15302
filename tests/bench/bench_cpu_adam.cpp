// CPU Adam against the machine's memory bandwidth, measured in the same run.
//
//   bench_cpu_adam [params (default 33554432)] [repeats (default 5)]
//
// Bandwidth bound: a STREAM triad a[i] = b[i] + s*c[i] over doubles, three arrays of `params` elements
// (3 x 256 MiB at the default, far beyond any last-level cache), best of `repeats` runs.
// Adam: cpu_adam_step over `params` fp32 parameters with a bf16 copy, best of `repeats` steps.
//
// Byte counting, the same for both (STREAM's convention: bytes the program asks to move, write-allocate
// traffic not counted): triad 24 B per element (read b, c; write a), Adam 30 B per parameter (read p, g,
// m, v = 16 B; write p, m, v = 12 B; write the bf16 copy = 2 B). Only the triad's a[] and Adam's copy are
// written without being read, so with write-allocate the hardware moves 32 B for both.
//
// Printed for one thread and for all threads: params/s, effective GB/s, ratio to the triad (target >= 0.85),
// the same ratio with write-allocate traffic counted for both (32 B per element and per parameter), and the
// speed-up over a plain scalar loop (adam_update + f32_to_bf16) compiled with the same flags.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: 65536 1
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench/bench_main.hpp"
#include "offload/cpu_adam.hpp"

using namespace zero3;

namespace {

using Clock = std::chrono::steady_clock;

template <typename T>
struct Freer {
  void operator()(T* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], Freer<T>>;

template <typename T>
Buffer<T> alloc(size_t n) {
  void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
  if (p == nullptr) {
    std::fprintf(stderr, "bench_cpu_adam: cannot allocate %zu bytes\n", n * sizeof(T));
    std::exit(1);
  }
  return Buffer<T>(static_cast<T*>(p));
}

template <typename F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double triad_gbs(size_t n, int threads, int repeats, double* a, const double* b, const double* c) {
  const double s = 3.0;
  double t = best_seconds(repeats, [&] {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
  });
  return 24.0 * static_cast<double>(n) / t / 1e9;
}

// The plain loop a compiler makes of the reference with the library's flags.
void plain_adam(float* p, const float* g, float* m, float* v, uint16_t* copy, size_t n, const AdamStepConsts& c,
                int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (size_t i = 0; i < n; ++i) {
    adam_update(p[i], g[i], m[i], v[i], c);
    copy[i] = f32_to_bf16(p[i]);
  }
}

}  // namespace

int bench_main(int argc, char** argv) {
  size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{1} << 25;
  int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  int max_threads = omp_get_num_procs();

  auto a = alloc<double>(n), b = alloc<double>(n), c = alloc<double>(n);
  auto p = alloc<float>(n), g = alloc<float>(n), m = alloc<float>(n), v = alloc<float>(n);
  auto copy = alloc<uint16_t>(n);
  // First touch by all threads with the same static split the kernels use.
#pragma omp parallel for schedule(static) num_threads(max_threads)
  for (size_t i = 0; i < n; ++i) {
    a[i] = 0.0;
    b[i] = 1.0;
    c[i] = 2.0;
    p[i] = 0.01f * static_cast<float>(i % 97);
    g[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
    m[i] = 0.0f;
    v[i] = 0.0f;
    copy[i] = 0;
  }

  AdamHyper hyper{.lr = 1e-4f, .weight_decay = 0.01f};
  int step = 0;
  std::printf("bench_cpu_adam: %zu params (%.2f GiB of Adam state), best of %d, ISA %s, %d hardware threads\n", n,
              30.0 * static_cast<double>(n) / (1 << 30), repeats, std::string(cpu_isa_name(cpu_isa_detect())).c_str(),
              max_threads);
  std::printf("counting: triad 24 B/elem, Adam 30 B/param (16 read + 12 written + 2 bf16 copy); no write-allocate\n");
  std::printf("%-8s %12s %14s %12s %10s %12s %14s %10s\n", "threads", "triad GB/s", "adam Mparam/s", "adam GB/s",
              "vs triad", "vs triad WA", "plain Mparam/s", "vs plain");
  for (int threads : {1, max_threads}) {
    double triad = triad_gbs(n, threads, repeats, a.get(), b.get(), c.get());
    double t_adam = best_seconds(repeats, [&] {
      cpu_adam_step(p.get(), g.get(), m.get(), v.get(), n, adam_step_consts(hyper, ++step), copy.get(), DType::bf16,
                    CpuIsa::best, threads);
    });
    double t_plain = best_seconds(repeats, [&] {
      plain_adam(p.get(), g.get(), m.get(), v.get(), copy.get(), n, adam_step_consts(hyper, ++step), threads);
    });
    double adam_params = static_cast<double>(n) / t_adam;
    double adam_gbs = 30.0 * adam_params / 1e9;
    double plain_params = static_cast<double>(n) / t_plain;
    double ratio_wa = (32.0 * adam_params) / (32.0 * triad * 1e9 / 24.0);
    std::printf("%-8d %12.2f %14.1f %12.2f %10.3f %12.3f %14.1f %10.2f\n", threads, triad, adam_params / 1e6, adam_gbs,
                adam_gbs / triad, ratio_wa, plain_params / 1e6, adam_params / plain_params);
    if (max_threads == 1) break;
  }
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

// CPU block quantization against memcpy, measured in the same run.
//
//   bench_block_quantize [elements (default 67108864)] [repeats (default 5)] [block (default 2048)]
//
// Input: `elements` bf16 values (128 MiB at the default, beyond any last-level cache). Each line is `repeats`
// runs, for one thread and for all of them, of:
//   memcpy            the bf16 buffer copied (split over the threads like the kernels)
//   quantize int8/4   bf16 -> one message (quantize_cpu)
//   dequantize int8/4 message -> bf16 (dequantize_cpu)
//   sum of 4 int8     four messages of elements/4 each -> fp32 (dequantize_sum_cpu: qgZ's receive side)
// for the best ISA and for the scalar reference.
//
// Bytes counted (what the call asks to read plus write; write-allocate traffic not counted): memcpy 4 B per
// element; quantize and dequantize 2 B of bf16 plus the message (1 B or 0.5 B per element, plus 4 B of scale
// per block); the sum reads the four messages and writes 4 B per output element. GB/s = bytes / best time.
// "vs memcpy": each repeat times a memcpy right before the operation, with the same threads, and divides the
// two GB/s; the column is the median of those ratios, so that on a machine whose bandwidth drifts (a shared
// one) each operation is compared with the memcpy of the same moment.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: 65536 1
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.hpp"
#include "kernels/block_quantize_cpu.hpp"

using namespace zero3;

namespace {

using Clock = std::chrono::steady_clock;

struct Freer {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, Freer>;

Buffer alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    std::fprintf(stderr, "bench_block_quantize: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  return Buffer(static_cast<uint8_t*>(p));
}

template <typename F>
double seconds(F&& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

void parallel_memcpy(uint8_t* dst, const uint8_t* src, size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
  {
    size_t per = (bytes / static_cast<size_t>(omp_get_num_threads()) + 63) / 64 * 64;
    size_t begin = std::min(bytes, per * static_cast<size_t>(omp_get_thread_num()));
    size_t end = std::min(bytes, begin + per);
    std::memcpy(dst + begin, src + begin, end - begin);
  }
}

}  // namespace

int bench_main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::strtoll(argv[1], nullptr, 10) : int64_t{1} << 26;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t block = argc > 3 ? std::strtoll(argv[3], nullptr, 10) : 2048;
  const int max_threads = omp_get_num_procs();
  const int parts = 4;
  if (n < parts || repeats < 1 || block < 2 || block % 2 != 0) {
    std::fprintf(stderr, "bench_block_quantize: expected elements >= 4, repeats >= 1, an even block >= 2\n");
    return 1;
  }
  const QuantFormat int8{8, block}, int4{4, block};
  const size_t in_bytes = static_cast<size_t>(n) * 2;
  const size_t m8 = static_cast<size_t>(quant_message_bytes(n, int8));
  const size_t m4 = static_cast<size_t>(quant_message_bytes(n, int4));
  const int64_t part = n / parts;
  const size_t m_parts = static_cast<size_t>(parts * quant_message_bytes(part, int8));

  Buffer src = alloc(in_bytes), dst = alloc(in_bytes), msg8 = alloc(m8), msg4 = alloc(m4), msgs = alloc(m_parts);
  Buffer sum = alloc(static_cast<size_t>(part) * 4);
  auto* x = reinterpret_cast<uint16_t*>(src.get());
#pragma omp parallel for schedule(static) num_threads(max_threads)
  for (int64_t i = 0; i < n; ++i) {
    // A weight-like spread: magnitudes 2^-10 .. 2^-1, both signs.
    float v = std::ldexp(1.0f + static_cast<float>(i % 251) / 251.0f, -1 - static_cast<int>((i / 7) % 10));
    x[i] = f32_to_bf16(i % 3 == 0 ? -v : v);
  }
  std::memset(dst.get(), 0, in_bytes);
  std::memset(msg8.get(), 0, m8);
  std::memset(msg4.get(), 0, m4);
  std::memset(sum.get(), 0, static_cast<size_t>(part) * 4);
  quantize_cpu(msgs.get(), src.get(), DType::bf16, part, parts, int8);

  std::printf(
      "bench_block_quantize: %lld bf16 elements (%.0f MiB), block %lld, %d repeats, best ISA %s, %d hardware "
      "threads\n",
      static_cast<long long>(n), static_cast<double>(in_bytes) / (1 << 20), static_cast<long long>(block), repeats,
      std::string(cpu_isa_name(cpu_isa_detect())).c_str(), max_threads);
  std::printf("%-8s %-8s %-22s %10s %10s %12s\n", "threads", "isa", "operation", "ms", "GB/s", "vs memcpy");
  for (int threads : {1, max_threads}) {
    omp_set_num_threads(threads);
    const double copy_bytes = 2.0 * static_cast<double>(in_bytes);
    auto copy = [&] { parallel_memcpy(dst.get(), src.get(), in_bytes, threads); };
    double t_copy = 1e30;
    for (int r = 0; r < repeats; ++r) t_copy = std::min(t_copy, seconds(copy));
    std::printf("%-8d %-8s %-22s %10.2f %10.2f %12s\n", threads, "-", "memcpy", t_copy * 1e3, copy_bytes / t_copy / 1e9,
                "-");
    for (CpuIsa isa : {CpuIsa::best, CpuIsa::scalar}) {
      const char* isa_name = isa == CpuIsa::best ? "best" : "scalar";
      struct Op {
        const char* name;
        double bytes;
        std::function<void()> run;
      };
      const Op ops[] = {
          {"quantize int8", static_cast<double>(in_bytes + m8),
           [&] { quantize_cpu(msg8.get(), src.get(), DType::bf16, n, 1, int8, isa); }},
          {"quantize int4", static_cast<double>(in_bytes + m4),
           [&] { quantize_cpu(msg4.get(), src.get(), DType::bf16, n, 1, int4, isa); }},
          {"dequantize int8", static_cast<double>(in_bytes + m8),
           [&] { dequantize_cpu(dst.get(), DType::bf16, msg8.get(), n, 1, int8, isa); }},
          {"dequantize int4", static_cast<double>(in_bytes + m4),
           [&] { dequantize_cpu(dst.get(), DType::bf16, msg4.get(), n, 1, int4, isa); }},
          {"sum of 4 int8 -> fp32", static_cast<double>(m_parts) + static_cast<double>(part) * 4,
           [&] { dequantize_sum_cpu(reinterpret_cast<float*>(sum.get()), msgs.get(), part, parts, int8, isa); }},
      };
      for (const Op& op : ops) {
        double best = 1e30;
        std::vector<double> ratios;
        for (int r = 0; r < repeats; ++r) {
          const double t_c = seconds(copy);
          const double t = seconds(op.run);
          best = std::min(best, t);
          ratios.push_back((op.bytes / t) / (copy_bytes / t_c));
        }
        std::printf("%-8d %-8s %-22s %10.2f %10.2f %12.3f\n", threads, isa_name, op.name, best * 1e3,
                    op.bytes / best / 1e9, median(ratios));
      }
    }
    if (max_threads == 1) break;
  }
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

// The latency of small collectives: what each call costs before its bytes matter. Part of it is the
// comparison of the ranks' calls that Gloo makes before any data moves (comm.hpp, "Agreement").
//
//   zero3 launch -n 2 -- build/bin/bench_latency [--iters 2000] [--count 1]
//
// For all_reduce (--count floats), all_gather_into and reduce_scatter (--count floats per rank), rank 0 times
// each of --iters calls (issue to completion) and prints the minimum, median and 90th percentile in
// microseconds. Gloo sends a call of at most 1 KiB per message with its description (comm.hpp, "Agreement");
// a larger --count (262144: 1 MiB, the engine benchmark's bucket) times the comparison as a message of its own
// before the data. Figures only; nothing is asserted.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --iters 20 --count 1
// zero3-bench-smoke-ranks: 2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.hpp"
#include "support/engine_world.hpp"
#include "zero3/comm.hpp"

using namespace zero3;

int bench_main(int argc, char** argv) {
  int iters = 2000;
  size_t count = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (std::string(argv[i]) == "--count") {
      count = static_cast<size_t>(std::atoll(argv[i + 1]));
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::shared_ptr<Communicator> comm(connect(testing::host_comm_options(std::chrono::seconds(120))));
  const auto n = static_cast<size_t>(comm->size());
  std::vector<float> one(count, 1.0f), all(n * count, 1.0f), out(n * count, 0.0f);
  const std::pair<const char*, std::function<void()>> ops[] = {
      {"all_reduce", [&] { comm->all_reduce(one.data(), count, DType::f32, ReduceOp::sum)->wait(); }},
      {"all_gather_into", [&] { comm->all_gather_into(out.data(), one.data(), count, DType::f32)->wait(); }},
      {"reduce_scatter",
       [&] { comm->reduce_scatter(one.data(), all.data(), count, DType::f32, ReduceOp::sum)->wait(); }},
  };
  if (comm->rank() == 0) {
    std::printf("bench_latency: %zu ranks (%s), %zu floats, %d calls each; microseconds per call\n", n,
                comm->backend(), count, iters);
    std::printf("%-16s %10s %10s %10s\n", "op", "min", "median", "p90");
  }
  for (const auto& [name, op] : ops) {
    comm->barrier();
    for (int i = 0; i < 50; ++i) op();  // warm up
    std::vector<double> us;
    us.reserve(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      op();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    if (comm->rank() == 0) {
      std::printf("%-16s %10.1f %10.1f %10.1f\n", name, us.front(), us[us.size() / 2], us[us.size() * 9 / 10]);
    }
  }
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

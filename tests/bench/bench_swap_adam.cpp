// The NVMe optimizer step without the engine around it: fp32 master weights and Adam moments of `params`
// parameters live in a swap file in tiles of `tile` parameters ([p | m | v], 12 B per parameter); each
// step streams every tile through the swapper (read ahead, Adam with a bf16 copy, write behind).
//
//   bench_swap_adam [DIR=. [params=67108864] [tile=8388608] [buffer_count=4] [steps=3] [engine=auto]]
//
// Bounds measured in the same run: the I/O alone (the same passes with an empty compute) and the compute
// alone (cpu_adam_step over the same tiles in memory). A fully overlapped step takes max(I/O, compute);
// printed: step time, the share of it the calling thread spent waiting on I/O, and the ratio of that
// bound to the step time (1.0: perfect overlap).
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: @DIR@ 65536 16384 3 1
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_main.hpp"
#include "io/aio_engine.hpp"
#include "offload/cpu_adam.hpp"
#include "offload/swap_file.hpp"
#include "offload/swapper.hpp"

using namespace zero3;
using namespace zero3::offload;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int bench_main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  size_t params = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : size_t{1} << 26;
  size_t tile_params = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : size_t{1} << 23;
  size_t buffer_count = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 4;
  int steps = argc > 5 ? std::atoi(argv[5]) : 3;
  std::optional<io::AioEngineKind> kind;
  if (argc > 6) kind = io::parse_aio_engine(argv[6]);

  std::vector<size_t> tile_bytes, tile_first;
  for (size_t first = 0; first < params; first += tile_params) {
    tile_first.push_back(first);
    tile_bytes.push_back(12 * std::min(tile_params, params - first));
  }
  auto tiles = pack_swap_tiles(tile_bytes);
  SwapFileSpec spec;
  spec.dir = dir;
  spec.tier = "optimizer";
  spec.bytes = swap_tiles_end(tiles);
  SwapFile file(spec);
  auto engine = io::make_aio_engine(AioConfig{}, kind);
  SwapperOptions opts;
  opts.buffer_count = buffer_count;
  Swapper swapper(*engine, file, tiles, opts);

  std::vector<float> grad(params);
  std::vector<uint16_t> copy(params);
  for (size_t i = 0; i < params; ++i) grad[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 201) - 100);
  swapper.run(SwapPass::write_only, [&](size_t t, std::span<std::byte> data) {
    size_t n = data.size() / 12;
    auto* p = reinterpret_cast<float*>(data.data());
    for (size_t i = 0; i < n; ++i) p[i] = 0.01f * static_cast<float>((tile_first[t] + i) % 97);
    std::memset(p + n, 0, 8 * n);  // m, v
  });

  AdamHyper hyper{.lr = 1e-4f, .weight_decay = 0.01f};
  int64_t step = 0;
  auto adam_tile = [&](size_t t, std::span<std::byte> data) {
    size_t n = data.size() / 12;
    auto* p = reinterpret_cast<float*>(data.data());
    cpu_adam_step(p, grad.data() + tile_first[t], p + n, p + 2 * n, n, adam_step_consts(hyper, step),
                  copy.data() + tile_first[t], DType::bf16);
  };

  std::printf("bench_swap_adam: %zu params in %zu tiles of %zu (%.1f MiB each), %zu buffers, engine %s, %s\n", params,
              tiles.size(), tile_params, 12.0 * static_cast<double>(tile_params) / (1 << 20), buffer_count,
              std::string(engine->name()).c_str(), file.path().c_str());

  // I/O alone.
  double io_only = 1e30;
  for (int s = 0; s < steps; ++s) {
    auto t0 = Clock::now();
    swapper.run(SwapPass::read_write, [](size_t, std::span<std::byte>) {});
    io_only = std::min(io_only, seconds_since(t0));
  }
  // Compute alone, over one tile-sized buffer in memory reused for every tile.
  std::vector<float> mem(3 * tile_params);
  double compute_only = 1e30;
  for (int s = 0; s < steps; ++s) {
    auto t0 = Clock::now();
    ++step;
    for (size_t t = 0; t < tiles.size(); ++t) {
      adam_tile(t, std::span<std::byte>(reinterpret_cast<std::byte*>(mem.data()), tile_bytes[t]));
    }
    compute_only = std::min(compute_only, seconds_since(t0));
  }
  // The real step.
  double best = 1e30, wait_share = 0;
  for (int s = 0; s < steps; ++s) {
    swapper.reset_stats();
    ++step;
    auto t0 = Clock::now();
    swapper.run(SwapPass::read_write, adam_tile);
    double t = seconds_since(t0);
    if (t < best) {
      best = t;
      wait_share = swapper.stats().io_wait_seconds / t;
    }
  }
  double bytes = 2.0 * static_cast<double>(swap_tiles_end(tiles));
  std::printf("I/O only      %8.3f s  (%.2f GB/s read+write)\n", io_only, bytes / io_only / 1e9);
  std::printf("compute only  %8.3f s  (%.0f Mparam/s)\n", compute_only,
              static_cast<double>(params) / compute_only / 1e6);
  std::printf("step          %8.3f s  (%.0f Mparam/s), waiting on I/O %.0f%% of it\n", best,
              static_cast<double>(params) / best / 1e6, 100.0 * wait_share);
  std::printf("overlap       %8.3f    (max(I/O, compute) / step; 1.0 = fully overlapped)\n",
              std::max(io_only, compute_only) / best);
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

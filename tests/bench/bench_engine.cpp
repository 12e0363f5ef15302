// Engine step time and communication volume, per ZeRO stage, on a transformer-shaped model.
//
//   zero3 launch -n 4 -- build/bin/bench_engine [--layers 8] [--hidden 512] [--steps 5] [--compute-passes 4]
//
// Each unit is a "layer" of seven matrices (q, k, v, o: hidden^2; gate, up, down: hidden x 8/3 hidden);
// its scopes do a fixed amount of arithmetic over the parameters (--compute-passes reads of every weight in
// forward, twice that in backward) so communication can hide behind it. Printed per stage: step time,
// elements all-gathered and reduced per step, their ratio to ZeRO-3's textbook volume of 3 x parameters
// per step (two all-gathers and one reduce-scatter of every parameter), the share of the step the
// training thread spent blocked on collectives, and the share it spent comparing the ranks' schedules (step()'s
// comparison of the micro-step's scope events). Figures only; nothing is asserted.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --layers 2 --hidden 64 --steps 2 --compute-passes 1
// zero3-bench-smoke-ranks: 2
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.hpp"
#include "support/engine_world.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/engine.hpp"

using namespace zero3;

namespace {

struct Options {
  int layers = 8;
  int64_t hidden = 512;
  int steps = 5;
  int compute_passes = 4;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    long v = std::strtol(argv[i + 1], nullptr, 10);
    if (k == "--layers")
      o.layers = static_cast<int>(v);
    else if (k == "--hidden")
      o.hidden = v;
    else if (k == "--steps")
      o.steps = static_cast<int>(v);
    else if (k == "--compute-passes")
      o.compute_passes = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      std::exit(2);
    }
  }
  return o;
}

// Reads every element `passes` times; returns a value so the compiler keeps the work.
float compute(const TensorView& v, int passes) {
  float acc = 0.0f;
  const float* p = v.as<float>();
  for (int k = 0; k < passes; ++k) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < v.numel; ++i) s += p[i] * 1.0001f;
    acc += s;
  }
  return acc;
}

Config bench_config(int stage, int64_t hidden) {
  Config c;
  c.zero.stage = stage;
  c.gradient_accumulation_steps = 1;
  c.train_micro_batch_size_per_gpu = 1;  // one sample per micro-step (resolve() needs a batch size)
  c.gradient_clipping = 1.0;
  c.optimizer.lr = 1e-4;
  c.optimizer.weight_decay = 0.0;
  c.zero.reduce_bucket_size = hidden * hidden;  // Hugging Face's "auto"
  c.zero.prefetch_bucket_size = hidden * hidden * 9 / 10;
  c.zero.param_persistence_threshold = 10 * hidden;
  c.zero.max_reuse_distance = 0;  // release every unit after use: the textbook ZeRO-3 traffic
  return c;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::shared_ptr<Communicator> comm(connect(testing::host_comm_options(std::chrono::seconds(120))));
  auto device = make_cpu_device();
  const int64_t h = o.hidden, f = h * 8 / 3;
  if (comm->rank() == 0) {
    std::printf("bench_engine: %d ranks (%s), %d layers, hidden %lld, %d steps, %d compute passes\n", comm->size(),
                comm->backend(), o.layers, static_cast<long long>(h), o.steps, o.compute_passes);
    std::printf("%-6s %12s %14s %14s %10s %12s %12s %10s %14s\n", "stage", "step ms", "gathered/step", "reduced/step",
                "vol/3P", "comm wait %", "MiB/rank", "agree %", "empty step us");
  }
  for (int stage = 0; stage <= 3; ++stage) {
    Engine e(zero3::testing::resolved_for(bench_config(stage, h), *comm), comm, *device);
    std::vector<UnitId> units;
    int64_t params = 0;
    for (int l = 0; l < o.layers; ++l) {
      UnitId u = e.add_unit("layer." + std::to_string(l));
      for (const char* n : {"q", "k", "v", "o"}) e.add_param(u, {n, {h, h}, ParamInit::normal(0.02)});
      e.add_param(u, {"gate", {f, h}, ParamInit::normal(0.02)});
      e.add_param(u, {"up", {f, h}, ParamInit::normal(0.02)});
      e.add_param(u, {"down", {h, f}, ParamInit::normal(0.02)});
      e.add_param(u, {"norm", {h}, ParamInit::ones()});
      units.push_back(u);
      params += e.unit(u).numel;
    }
    e.materialize();
    float sink = 0.0f;
    auto one_step = [&] {
      for (UnitId u : units) {
        auto s = e.forward_scope(u);
        sink += compute(s.flat_params(), o.compute_passes);
      }
      for (auto it = units.rbegin(); it != units.rend(); ++it) {
        auto s = e.backward_scope(*it);
        sink += compute(s.flat_params(), 2 * o.compute_passes);
        TensorView g = s.flat_grads();
        float* gp = g.as<float>();
        for (int64_t i = 0; i < g.numel; ++i) gp[i] = 1e-4f * static_cast<float>(i % 13);
      }
      e.step();
    };
    one_step();  // records the order
    e.reset_schedule_stats();
    // Through the engine: step() leaves the next micro-step's gathers queued on overlap_comm's thread, which
    // communicator() lets run first, so that every rank reaches the barrier after the same collectives.
    e.communicator().barrier();
    auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < o.steps; ++s) one_step();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ScheduleStats st = e.schedule_stats();
    // The fixed cost of a micro-step's schedule comparison, without the ranks' compute skew in it: step() calls
    // with no scope since the last one, once the ranks are level (such a step compares the events, finds no
    // backward and applies nothing: the comparison's all_reduce is its only collective).
    e.communicator().barrier();
    std::vector<double> empty_us;
    for (int k = 0; k < 50; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      e.step();
      empty_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(empty_us.begin(), empty_us.end());
    double gathered = static_cast<double>(st.gathered_elements) / o.steps;
    double reduced = static_cast<double>(st.reduced_elements) / o.steps;
    double ratio = (gathered + reduced) / (3.0 * static_cast<double>(params));
    double wait_share = 100.0 * st.comm_wait_seconds / seconds;
    double mib = static_cast<double>(e.memory().peak_total) / (1024.0 * 1024.0);
    double agree_share = 100.0 * st.agreement_seconds / seconds;
    if (comm->rank() == 0) {
      std::printf("%-6d %12.2f %14.0f %14.0f %10.3f %12.1f %12.1f %10.3f %14.1f\n", stage, 1e3 * seconds / o.steps,
                  gathered, reduced, ratio, wait_share, mib, agree_share, empty_us[empty_us.size() / 2]);
    }
    if (!std::isfinite(sink)) std::printf("(%g)\n", sink);
  }
  if (comm->rank() == 0) {
    std::printf(
        "vol/3P: elements moved by all-gathers and reductions per step over 3 x parameters (ZeRO-3's "
        "volume; stages 0-2 all-reduce or reduce-scatter once and gather once)\n"
        "agree %%: the training thread in step()'s comparison of the ranks' scope events (one 8-float all_reduce "
        "per micro-step; as the first point of step() where the ranks wait for each other, it also takes the "
        "wait for the slowest rank that the next collective would take otherwise)\n"
        "empty step us: median of 50 step() calls with no scope, the ranks level: the comparison alone\n");
  }
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

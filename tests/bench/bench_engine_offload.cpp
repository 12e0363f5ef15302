// Engine step time with offload on the cpu device. Optimizer offload: none, to cpu (the SIMD CPU Adam per tile
// over host-resident state) and to nvme (fp32 master and Adam moments streamed through the swapper at every
// step). Parameter offload to nvme (bf16): the slices read from the swap file for every all-gather, either at
// the gather (stage3_prefetch_bucket_size 0: the training thread waits for each whole read, as before reads
// ran ahead) or ahead along the schedule into offload_param.buffer_count buffers.
// Printed per mode: time per optimizer step (forward, backward, reductions and the step), the training
// thread's time blocked on swap I/O per step and its share of the step, and the swap traffic per step (for
// parameters: the time blocked on slice reads, the reads per step and how many of them had been started
// ahead of their gather). Two models: the equivalence tests' MLP (tiny: per-request latency dominates) and a
// wide one of the same shape whose state is large enough for bandwidth to matter.
//
//   zero3 launch -n N -- bench_engine_offload [--dir /tmp] [--steps 10] [--stage 3] [--wide 1024]
//
// --dir must be on a disk file system (O_DIRECT). Figures only; nothing is asserted.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --dir @DIR@ --steps 2 --wide 64
// zero3-bench-smoke-ranks: 2
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

// Benches link only the library: the equivalence model's sources are compiled in.
#include "bench/bench_main.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.cpp"
#include "support/reference_model.cpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;
using Clock = std::chrono::steady_clock;

namespace {

struct Figures {
  double step_s = 0;
  double io_wait_s = 0;  // optimizer swap I/O, per step
  double mb_moved = 0;
  double read_wait_s = 0;  // parameter slice reads, per step
  double reads = 0;        // per step
  double reads_ahead = 0;  // per step
};

Figures run(const Config& c, const std::shared_ptr<Communicator>& comm, Device& device, const MlpDims& dims,
            int64_t steps) {
  Engine engine(resolved_for(c, *comm), comm, device);
  MlpUnits units = declare_mlp(engine, dims);
  engine.materialize();
  TrainPlan plan;
  plan.world = comm->size();
  plan.dims = dims;
  plan.steps = 1;
  train_mlp(engine, units, plan);  // warm-up: first micro-steps record and check the schedule
  engine.reset_offload_stats();
  engine.reset_schedule_stats();
  // Through the engine: step() leaves the next micro-step's gathers queued on overlap_comm's thread, which
  // communicator() lets run first, so that every rank reaches the barrier after the same collectives.
  engine.communicator().barrier();
  auto t0 = Clock::now();
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t s = 1; s <= steps; ++s) {
    for (int64_t k = 0; k < gas; ++k) {
      Batch b = make_batch(dims, plan.data_seed, batch_index(s, k, gas, comm->rank(), comm->size()), plan.micro_batch);
      mlp_micro_step(engine, units, dims, b);
      engine.step();
    }
  }
  engine.communicator().barrier();
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  OffloadStats o = engine.offload_stats();
  ScheduleStats sc = engine.schedule_stats();
  const double n = static_cast<double>(steps);
  Figures f;
  f.step_s = total / n;
  f.io_wait_s = o.io_wait_seconds / n;
  f.mb_moved = static_cast<double>(o.bytes_read + o.bytes_written) / 1e6 / n;
  f.read_wait_s = sc.param_read_wait_seconds / n;
  f.reads = static_cast<double>(sc.param_reads) / n;
  f.reads_ahead = static_cast<double>(sc.param_reads_ahead) / n;
  return f;
}

}  // namespace

int bench_main(int argc, char** argv) {
  std::string dir = "/tmp";
  int64_t steps = 10;
  int stage = 3;
  int64_t wide = 1024;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: bench_engine_offload [--dir DIR] [--steps N] [--stage S] [--wide W]\n");
      return 0;
    }
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dir"))
      dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stage"))
      stage = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--wide"))
      wide = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  try {
    auto comm = std::shared_ptr<Communicator>(connect(host_comm_options()));
    auto device = make_cpu_device();
    const MlpDims models[] = {MlpDims{}, MlpDims{wide / 4, wide, wide, wide / 4}};
    const char* model_names[] = {"equivalence MLP", "wide MLP"};
    for (int mi = 0; mi < 2; ++mi) {
      const MlpDims& d = models[mi];
      int64_t params = 0;
      for (const MlpParamDesc& p : mlp_params(d)) params += p.numel();
      if (comm->rank() == 0) {
        std::printf("%s (%d,%d,%d,%d; %lld parameters), stage %d, %d rank(s), %lld steps\n", model_names[mi],
                    static_cast<int>(d.in), static_cast<int>(d.h1), static_cast<int>(d.h2), static_cast<int>(d.out),
                    static_cast<long long>(params), stage, comm->size(), static_cast<long long>(steps));
        std::printf("  %-26s %10s %14s %10s %14s\n", "offload_optimizer", "ms/step", "io wait ms", "io share",
                    "swap MB/step");
      }
      for (OffloadDevice od : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme}) {
        Config c = equivalence_config(stage);
        c.steps_per_print = 0;
        c.zero.sub_group_size = 1'000'000;
        c.zero.offload_optimizer.device = od;
        c.zero.offload_optimizer.nvme_path = dir;
        c.zero.offload_optimizer.pipeline_read = true;
        c.zero.offload_optimizer.pipeline_write = true;
        Figures f = run(c, comm, *device, d, steps);
        if (comm->rank() == 0) {
          const char* name = od == OffloadDevice::none ? "none" : od == OffloadDevice::cpu ? "cpu" : "nvme";
          std::printf("  %-26s %10.3f %14.3f %9.1f%% %14.2f\n", name, f.step_s * 1e3, f.io_wait_s * 1e3,
                      100.0 * f.io_wait_s / f.step_s, f.mb_moved);
        }
      }
      if (stage != 3) continue;  // parameter offload is stage 3 only
      // Parameter offload to nvme, bf16 compute (the slices in the swap file are 16-bit).
      if (comm->rank() == 0) {
        std::printf("  %-26s %10s %14s %10s %11s %11s\n", "offload_param (bf16)", "ms/step", "read wait ms",
                    "wait share", "reads/step", "read ahead");
      }
      struct ParamMode {
        const char* name;
        bool nvme;
        int64_t buffers;
        bool prefetch;
      };
      const ParamMode modes[] = {{"none", false, 0, true},
                                 {"nvme, reads at the gather", true, 5, false},
                                 {"nvme, 1 buffer ahead", true, 1, true},
                                 {"nvme, 2 buffers ahead", true, 2, true},
                                 {"nvme, 4 buffers ahead", true, 4, true}};
      for (const ParamMode& m : modes) {
        Config c = equivalence_config(stage);
        c.steps_per_print = 0;
        c.bf16.enabled = true;
        if (!m.prefetch) c.zero.prefetch_bucket_size = 0;
        if (m.nvme) {
          c.zero.offload_param.device = OffloadDevice::nvme;
          c.zero.offload_param.nvme_path = dir;
          c.zero.offload_param.buffer_count = m.buffers;
        }
        Figures f = run(c, comm, *device, d, steps);
        if (comm->rank() == 0) {
          std::printf("  %-26s %10.3f %14.3f %9.1f%% %11.1f %10.0f%%\n", m.name, f.step_s * 1e3, f.read_wait_s * 1e3,
                      100.0 * f.read_wait_s / f.step_s, f.reads, f.reads > 0 ? 100.0 * f.reads_ahead / f.reads : 0.0);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_engine_offload: %s\n", e.what());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

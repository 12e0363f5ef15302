// Engine step time with optimizer offload on the cpu device: none, to cpu (the SIMD CPU Adam per tile over
// host-resident state) and to nvme (fp32 master and Adam moments streamed through the swapper at every step).
// Printed per mode: time per optimizer step (forward, backward, reductions and the step), the training
// thread's time blocked on swap I/O per step and its share of the step, and the swap traffic per step.
// Two models: the equivalence tests' MLP (tiny: per-request latency dominates) and a wide one of the same
// shape whose state is large enough for bandwidth to matter.
//
//   zero3 launch -n N -- bench_engine_offload [--dir /tmp] [--steps 10] [--stage 3] [--wide 1024]
//
// --dir must be on a disk file system (O_DIRECT). Figures only; nothing is asserted.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

// Benches link only the library: the equivalence model's sources are compiled in.
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
  double io_wait_s = 0;
  double mb_moved = 0;
};

Figures run(const Config& c, const std::shared_ptr<Communicator>& comm, Device& device, const MlpDims& dims,
            int64_t steps) {
  Engine engine(c, comm, device);
  MlpUnits units = declare_mlp(engine, dims);
  engine.materialize();
  TrainPlan plan;
  plan.world = comm->size();
  plan.dims = dims;
  plan.steps = 1;
  train_mlp(engine, units, plan);  // warm-up: first micro-steps record and check the schedule
  engine.reset_offload_stats();
  comm->barrier();
  auto t0 = Clock::now();
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t s = 1; s <= steps; ++s) {
    for (int64_t k = 0; k < gas; ++k) {
      Batch b = make_batch(dims, plan.data_seed, batch_index(s, k, gas, comm->rank(), comm->size()), plan.micro_batch);
      mlp_micro_step(engine, units, dims, b);
      engine.step();
    }
  }
  comm->barrier();
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  OffloadStats o = engine.offload_stats();
  Figures f;
  f.step_s = total / static_cast<double>(steps);
  f.io_wait_s = o.io_wait_seconds / static_cast<double>(steps);
  f.mb_moved = static_cast<double>(o.bytes_read + o.bytes_written) / 1e6 / static_cast<double>(steps);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  int64_t steps = 10;
  int stage = 3;
  int64_t wide = 1024;
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
        std::printf("  %-14s %12s %14s %10s %14s\n", "offload", "ms/step", "io wait ms", "io share", "swap MB/step");
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
          std::printf("  %-14s %12.3f %14.3f %9.1f%% %14.2f\n", name, f.step_s * 1e3, f.io_wait_s * 1e3,
                      100.0 * f.io_wait_s / f.step_s, f.mb_moved);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_engine_offload: %s\n", e.what());
    return 1;
  }
  return 0;
}

// The engine's stream path (the one it takes on a cuda device) run on the CPU: a test device that reports
// itself as cuda but keeps host memory, runs the cpu kernels and runs each stream's work only when something
// waits for it, or side streams' work at once (support/stream_path_device.hpp: both schedules run), and a
// communicator that reports "nccl" and queues each collective on its stream (support/stream_path_comm.hpp). Everything
// the GPU path does differently on the host side (inline queue, Works handed to CommQueue::track, events between the
// compute, gather and reduce streams, agreement and statistics staged through device memory, stream-ordered frees) then
// runs in CI and must give the reference's numbers, like the dist equivalence tests, on 1-3 ranks.
//
// The device also checks the ordering rules the GPU relies on: no stream or host waits on an event that was
// never recorded (CUDA would silently not wait), events are recorded on real streams only, no memory is freed
// while queued work uses it, no stream uses device memory before it is ordered after its allocation, kernels
// and collectives run on device memory, the compute stream waits for every stage-3 gather, and gathers and
// reductions are issued on the engine's own streams. Every case runs again with the device computing on a
// caller's stream: then nothing may land on CUDA's legacy default stream.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/reference_model.hpp"
#include "support/stream_path_checks.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Variant {
  std::string name;
  int stage;
  std::function<void(Config&)> change;
  double tolerance;
};

class StreamPath : public ::testing::TestWithParam<Variant> {};

void check_against_reference(const Variant& v, StreamSchedule schedule, ComputeStream compute);

TEST_P(StreamPath, SameNumbersAsTheReferenceAndOrderedByEvents) {
  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "side streams run when waited for" : "side streams run at once");
    check_against_reference(GetParam(), schedule, ComputeStream::legacy);
  }
}

// The device computes on a stream of the caller's (make_device("cuda", stream)): the engine's compute work lands
// there and nothing on CUDA's legacy default stream, which is not ordered with it.
TEST_P(StreamPath, OnTheCallersStream) {
  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "side streams run when waited for" : "side streams run at once");
    check_against_reference(GetParam(), schedule, ComputeStream::callers);
  }
}

void check_against_reference(const Variant& v, StreamSchedule schedule, ComputeStream compute) {
  StreamPathDevice device(schedule, compute);
  auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
  Config c = equivalence_config(v.stage);
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;
  EngineRun run;
  ScheduleStats stats;
  {
    Engine engine(c, comm, device);
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    engine.reset_schedule_stats();
    run = train_mlp(engine, units, plan);
    stats = engine.schedule_stats();
  }
  EXPECT_EQ(device.bytes_in_use(), 0);
  ReferenceRun ref = run_reference(c, plan);
  const int rank = comm->rank();
  const size_t gas = 2;
  ASSERT_EQ(run.losses.size(), static_cast<size_t>(plan.steps) * gas);
  for (size_t t = 0; t < static_cast<size_t>(plan.steps); ++t) {
    for (size_t k = 0; k < gas; ++k) {
      double want = ref.losses[t][k][static_cast<size_t>(rank)];
      EXPECT_NEAR(run.losses[t * gas + k], want, v.tolerance * std::fabs(want)) << "step " << t << ", micro " << k;
    }
    EXPECT_NEAR(run.steps[t * gas + gas - 1].grad_norm, ref.grad_norms[t], v.tolerance * ref.grad_norms[t]);
  }
  std::string worst;
  EXPECT_LE(max_relative_error(run.params, ref.params, &worst), v.tolerance) << "at " << worst;

  device.synchronize();
  const StreamPathUsage u = device.usage();
  expect_gpu_ordering_rules(u, *comm);
  EXPECT_GT(u.compute_stream_ops, 0) << "no work on the compute stream";
  EXPECT_GT(comm->side_stream_reductions(), 0) << "no reduction on the reduce stream";
  if (v.stage == 3) {
    EXPECT_GE(comm->side_stream_gathers(), stats.all_gathers) << "stage-3 gathers must run on the gather stream";
    EXPECT_GE(u.compute_waits, stats.all_gathers) << "the compute stream must wait for every gather";
  }
}

const Variant kVariants[] = {
    {"stage0", 0, nullptr, 1e-5},
    {"stage1", 1, nullptr, 1e-5},
    {"stage2", 2, nullptr, 1e-5},
    {"stage3", 3, nullptr, 1e-5},
    {"stage3_bf16", 3, [](Config& c) { c.bf16.enabled = true; }, 5e-3},
};

INSTANTIATE_TEST_SUITE_P(Engine, StreamPath, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace

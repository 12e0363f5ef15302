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
// caller's stream: then nothing may land on CUDA's legacy default stream. On simulated nodes
// (`zero3 launch --simulate-nodes`) the same checks cover the layouts for slow links: HSDP, MiCS's hierarchical
// gather and hpZ, whose groups are split from the test communicator. ZeRO++'s quantized paths (qwZ's int8 gathers,
// qgZ's two all-to-alls) run under the same checks; their numbers are compared with the same config on the plain cpu
// device, bit for bit (the unquantized reference differs by the quantization itself).
// zero3-test-ranks: 1 2 3
// zero3-test-nodes: 2x2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
  bool layout = false;  // needs simulated nodes (and runs only there)
  // Compare with the same config on the plain cpu device (same kernels, same collectives: the same bits) instead of
  // the unquantized reference model, which a quantized run cannot match.
  bool against_cpu_device = false;
};

bool simulated_nodes() {
  const LaunchInfo launch = detect_launch();
  return launch.local_world_size < launch.world_size;
}

class StreamPath : public ::testing::TestWithParam<Variant> {};

void check_against_reference(const Variant& v, StreamSchedule schedule, ComputeStream compute);

// Layouts for slow links need nodes; plain ZeRO runs on one.
#define SKIP_UNLESS_ON_ITS_NODES()                                                                          \
  if (GetParam().layout != simulated_nodes()) {                                                             \
    GTEST_SKIP() << (GetParam().layout ? "layouts run on simulated nodes" : "plain ZeRO runs on one node"); \
  }                                                                                                         \
  if (GetParam().against_cpu_device && detect_launch().world_size == 1) {                                   \
    GTEST_SKIP() << "one rank sends no quantized message (its gathers and reductions have no peer)";        \
  }

TEST_P(StreamPath, SameNumbersAsTheReferenceAndOrderedByEvents) {
  SKIP_UNLESS_ON_ITS_NODES();
  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "side streams run when waited for" : "side streams run at once");
    check_against_reference(GetParam(), schedule, ComputeStream::legacy);
  }
}

// The device computes on a stream of the caller's (make_device("cuda", stream)): the engine's compute work lands
// there and nothing on CUDA's legacy default stream, which is not ordered with it.
TEST_P(StreamPath, OnTheCallersStream) {
  SKIP_UNLESS_ON_ITS_NODES();
  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "side streams run when waited for" : "side streams run at once");
    check_against_reference(GetParam(), schedule, ComputeStream::callers);
  }
}

EngineRun train(const Config& c, const TrainPlan& plan, const std::shared_ptr<Communicator>& comm, Device& device,
                ScheduleStats* stats = nullptr) {
  Engine engine(resolved_for(c, *comm), comm, device);
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  engine.reset_schedule_stats();
  EngineRun run = train_mlp(engine, units, plan);
  if (stats != nullptr) *stats = engine.schedule_stats();
  return run;
}

void check_against_reference(const Variant& v, StreamSchedule schedule, ComputeStream compute) {
  StreamPathDevice device(schedule, compute);
  auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
  Config c = equivalence_config(v.stage);
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;
  ScheduleStats stats;
  const EngineRun run = train(c, plan, comm, device, &stats);
  EXPECT_EQ(device.bytes_in_use(), 0);
  const int rank = comm->rank();
  const size_t gas = 2;
  ASSERT_EQ(run.losses.size(), static_cast<size_t>(plan.steps) * gas);
  if (v.against_cpu_device) {
    const EngineRun want = train(c, plan, engine_world(), cpu_device());
    ASSERT_EQ(want.losses.size(), run.losses.size());
    for (size_t i = 0; i < run.losses.size(); ++i) {
      EXPECT_NEAR(run.losses[i], want.losses[i], v.tolerance * std::fabs(want.losses[i])) << "micro-step " << i;
      EXPECT_NEAR(run.steps[i].grad_norm, want.steps[i].grad_norm, v.tolerance * want.steps[i].grad_norm)
          << "micro-step " << i;
    }
    std::string worst;
    EXPECT_LE(max_relative_error(run.params, want.params, &worst), v.tolerance) << "at " << worst;
  } else {
    ReferenceRun ref = run_reference(c, plan);
    for (size_t t = 0; t < static_cast<size_t>(plan.steps); ++t) {
      for (size_t k = 0; k < gas; ++k) {
        double want = ref.losses[t][k][static_cast<size_t>(rank)];
        EXPECT_NEAR(run.losses[t * gas + k], want, v.tolerance * std::fabs(want)) << "step " << t << ", micro " << k;
      }
      EXPECT_NEAR(run.steps[t * gas + gas - 1].grad_norm, ref.grad_norms[t], v.tolerance * ref.grad_norms[t]);
    }
    std::string worst;
    EXPECT_LE(max_relative_error(run.params, ref.params, &worst), v.tolerance) << "at " << worst;
  }

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

void quantized(Config& c, bool weights, bool gradients) {
  c.bf16.enabled = true;
  c.zero.param_persistence_threshold = 0;
  c.zero.max_reuse_distance = 0;
  c.zero.reduce_bucket_size = 150;  // several qgZ buckets a micro-step
  c.zero.quantized_weights = weights;
  c.zero3.qwz_block_size = 16;
  c.zero.quantized_gradients = gradients;
  c.zero3.qgz_block_size = 32;
}

const Variant kVariants[] = {
    {"stage0", 0, nullptr, 1e-5},
    {"stage1", 1, nullptr, 1e-5},
    {"stage2", 2, nullptr, 1e-5},
    {"stage3", 3, nullptr, 1e-5},
    {"stage3_bf16", 3,
     [](Config& c) {
       c.bf16.enabled = true;
       c.communication_data_type = DType::f32;
     },
     5e-3},
    {"hsdp", 3, [](Config& c) { c.zero.mics_shard_size = detect_launch().local_world_size; }, 1e-5, true},
    {"mics_hierarchical", 3,
     [](Config& c) {
       c.zero.mics_shard_size = detect_launch().world_size;
       c.zero.mics_hierarchical_params_gather = true;
       c.zero.param_persistence_threshold = 0;
     },
     1e-5, true},
    {"hpz_bf16", 3,
     [](Config& c) {
       c.zero.hpz_partition_size = detect_launch().local_world_size;
       c.zero.max_reuse_distance = 0;  // backward gathers again, from the secondary partition
       c.bf16.enabled = true;
       c.communication_data_type = DType::f32;
     },
     5e-3, true},
    // ZeRO++ (bf16, small blocks so that slices hold several and a partial one; every unit gathered again in
    // backward): the same bits as on the cpu device, tolerance 0.
    {"qwz", 3, [](Config& c) { quantized(c, true, false); }, 0, false, true},
    {"qgz", 3, [](Config& c) { quantized(c, false, true); }, 0, false, true},
    {"qwz_qgz", 3, [](Config& c) { quantized(c, true, true); }, 0, false, true},
    {"hpz_qwz_qgz", 3,
     [](Config& c) {
       quantized(c, true, true);
       c.zero.hpz_partition_size = detect_launch().local_world_size;
     },
     0, true, true},
};

INSTANTIATE_TEST_SUITE_P(Engine, StreamPath, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

// NCCL cannot tell calls of different sizes apart (a hang, or the wrong bytes), so on a communicator that does not
// compare calls the engine compares, in the micro-steps it checks (the first, and every one with
// zero3.check_schedule_every_step; each comparison is a host wait), every scope entry and each collective's
// description before issuing it. A forward run in reverse on the last rank in micro-step 3 then fails on every rank
// at its first entry: the all-gather of another unit never reaches the communicator.
std::string reversed_forward_error(bool check_every_step, int64_t* device_bytes_left) {
  auto world = engine_world();
  StreamPathDevice device;
  auto comm = std::make_shared<StreamPathComm>(world, device);
  EXPECT_FALSE(comm->checks_collectives());
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 1;
  c.zero3.check_schedule_every_step = check_every_step;
  const int last = comm->size() - 1;
  std::string message;
  {
    Engine e(resolved_for(c, *comm), comm, device);
    MlpDims d;
    MlpUnits units = declare_mlp(e, d);
    e.materialize();
    for (int step = 0; step < 3; ++step) {
      mlp_micro_step(e, units, d, make_batch(d, 1, step * comm->size() + comm->rank(), 2));
      EXPECT_TRUE(e.step().applied);
    }
    std::vector<UnitId> order = {units.fc1, units.norm, units.fc2, units.head};
    if (comm->rank() == last) std::reverse(order.begin(), order.end());
    try {
      for (UnitId u : order) {
        auto s = e.forward_scope(u);
      }
      e.step();
      ADD_FAILURE() << "no error on rank " << comm->rank();
    } catch (const CommError& err) {
      message = err.what();
    }
  }
  *device_bytes_left = device.bytes_in_use();
  return message;
}

TEST(StreamPathDivergence, AReversedForwardIsStoppedBeforeTheCommunicator) {
  if (engine_world()->size() == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  int64_t left = -1;
  const std::string message = reversed_forward_error(true, &left);
  const int last = engine_world()->size() - 1;
  EXPECT_TRUE(message.find("different orders at scope event 0 of micro-step 3") != std::string::npos) << message;
  EXPECT_TRUE(message.find("rank " + std::to_string(last) + " called forward_scope('head')") != std::string::npos)
      << message;
  EXPECT_TRUE(message.find("Found when the ranks' collectives differed") == std::string::npos) << message;
  EXPECT_EQ(left, 0);
}


}  // namespace

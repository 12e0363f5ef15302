// The engine's stream path (the one it takes on a cuda device) run on the CPU: a test device that reports
// itself as cuda but keeps host memory and runs the cpu kernels, with stream and event handles that record
// how the engine uses them, and a communicator that reports "nccl" and completes each collective before
// returning. Everything the GPU path does differently on the host side (inline queue, Works handed to
// CommQueue::track, events between the compute, gather and reduce streams, agreement and statistics
// staged through device memory, stream-ordered frees) then runs in CI and must give the reference's
// numbers, like the dist equivalence tests, on 1-3 ranks.
//
// The fake events also check the ordering rules the GPU relies on: no stream waits on an event that was
// never recorded (CUDA would silently not wait), events are recorded on real streams only, the compute
// stream waits for every stage-3 gather, and gathers and reductions are issued on the engine's own streams.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/reference_model.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Usage {
  std::atomic<int64_t> waits_before_record{0};  // wait_on of an event never recorded
  std::atomic<int64_t> null_stream_events{0};   // record or wait_on with a null stream
  std::atomic<int64_t> compute_waits{0};        // wait_on(compute stream)
  std::atomic<int64_t> side_stream_gathers{0};  // all_gather_into on one of the engine's own streams
  std::atomic<int64_t> side_stream_reductions{0};
  std::atomic<int64_t> streams_made{0};
};

Usage g_usage;
int g_handles[16];  // addresses used as stream handles
Stream handle(int i) { return reinterpret_cast<Stream>(&g_handles[i]); }
const Stream kCompute = handle(0);

class FakeStream final : public DeviceStream {
 public:
  explicit FakeStream(Stream s) : s_(s) {}
  Stream get() const override { return s_; }
  void synchronize() override {}

 private:
  Stream s_;
};

class FakeEvent final : public DeviceEvent {
 public:
  void record(Stream stream) override {
    if (stream == nullptr) g_usage.null_stream_events++;
    recorded_ = true;
  }
  void wait_on(Stream stream) override {
    if (stream == nullptr) g_usage.null_stream_events++;
    if (!recorded_) g_usage.waits_before_record++;
    if (stream == kCompute) g_usage.compute_waits++;
  }
  void synchronize() override {}
  bool done() override { return true; }

 private:
  bool recorded_ = false;
};

// Host memory and cpu kernels behind a device that says it is cuda.
class StreamPathDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::cuda; }
  int index() const override { return 0; }
  std::string name() const override { return "stream-path test device"; }
  void* allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) noexcept override { cpu_->deallocate(ptr, bytes); }
  void deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept override { cpu_->deallocate(ptr, bytes); }
  void copy(void* dst, const void* src, size_t bytes, Stream stream) override { cpu_->copy(dst, src, bytes); }
  void move(void* dst, const void* src, size_t bytes, Stream stream) override { cpu_->move(dst, src, bytes); }
  void fill_zero(void* ptr, size_t bytes, Stream stream) override { cpu_->fill_zero(ptr, bytes); }
  void synchronize() override {}
  int64_t bytes_in_use() const override { return cpu_->bytes_in_use(); }
  int64_t peak_bytes_in_use() const override { return cpu_->peak_bytes_in_use(); }
  detail::DeviceKernels& kernels() override { return cpu_->kernels(); }
  Stream default_stream() const override { return kCompute; }
  std::unique_ptr<DeviceStream> make_stream() override {
    int64_t i = ++g_usage.streams_made;
    return std::make_unique<FakeStream>(handle(static_cast<int>(1 + (i % 15))));
  }
  std::unique_ptr<DeviceEvent> make_event() override { return std::make_unique<FakeEvent>(); }

 private:
  std::unique_ptr<Device> cpu_ = make_cpu_device();
};

// Reports "nccl"; runs each collective on the real (gloo or local) communicator and waits for it, so the
// data is in place when the call returns, as the stream order guarantees on a GPU.
class StreamPathComm final : public Communicator {
 public:
  explicit StreamPathComm(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) override {
    if (stream != nullptr && stream != kCompute) g_usage.side_stream_gathers++;
    inner_->all_gather_into(out, in, count, dtype)->wait();
    return completed_work();
  }
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (stream != nullptr && stream != kCompute) g_usage.side_stream_reductions++;
    inner_->reduce_scatter(out, in, count, dtype, op)->wait();
    return completed_work();
  }
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    if (stream != nullptr && stream != kCompute) g_usage.side_stream_reductions++;
    inner_->all_reduce(buf, count, dtype, op)->wait();
    return completed_work();
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    inner_->broadcast(buf, count, dtype, root)->wait();
    return completed_work();
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> split(int, int) override {
    throw Unsupported("stream-path test communicator does not support split");
  }

 private:
  std::shared_ptr<Communicator> inner_;
};

struct Variant {
  std::string name;
  int stage;
  std::function<void(Config&)> change;
  double tolerance;
};

class StreamPath : public ::testing::TestWithParam<Variant> {};

TEST_P(StreamPath, SameNumbersAsTheReferenceAndOrderedByEvents) {
  const Variant& v = GetParam();
  auto comm = std::make_shared<StreamPathComm>(engine_world());
  Config c = equivalence_config(v.stage);
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;
  StreamPathDevice device;
  const int64_t side_gathers_before = g_usage.side_stream_gathers.load();
  const int64_t side_reductions_before = g_usage.side_stream_reductions.load();
  const int64_t compute_waits_before = g_usage.compute_waits.load();
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

  EXPECT_EQ(g_usage.waits_before_record.load(), 0) << "a stream waited on an event that was never recorded";
  EXPECT_EQ(g_usage.null_stream_events.load(), 0) << "an event was recorded or waited on the null stream";
  EXPECT_GT(g_usage.side_stream_reductions.load(), side_reductions_before) << "no reduction on the reduce stream";
  if (v.stage == 3) {
    const int64_t gathers = g_usage.side_stream_gathers.load() - side_gathers_before;
    EXPECT_GE(gathers, stats.all_gathers) << "stage-3 gathers must run on the gather stream";
    EXPECT_GE(g_usage.compute_waits.load() - compute_waits_before, stats.all_gathers)
        << "the compute stream must wait for every gather";
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

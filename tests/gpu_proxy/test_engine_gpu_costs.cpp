// What a micro-step of the engine costs a GPU, counted on the CPU by the stream-path test device
// (support/stream_path_device.hpp): host synchronizations and device allocations in steady state, at stage 3,
// with and without offload, on CUDA's legacy default stream and on a caller's stream.
//
// The model queues all its work on the device's compute stream and never waits (QueuedModel: each forward
// scope adds the unit's parameters into an activation buffer, each backward scope writes a gradient computed
// from the parameters), so every host synchronization counted is the engine's. Its numbers must be the bits of
// the same model on the cpu device.
//
// Steady state: after two optimizer steps (the first micro-step records the schedule, the first steps grow the
// pools), each of the next micro-steps is measured alone. Device allocations (growth of the stream-ordered pool)
// must be 0 there, and so must host synchronizations within the accumulation window; the boundary makes one (the
// optimizer step reads the agreed statistics), plus with offload one per optimizer tile (its gradients reach the
// host for the CPU Adam): docs/gpu.md, "Host synchronizations", says why each remains.
// Also counted: the reduce-scatters in flight while backward goes on (more than two where the buckets allow), and
// the next micro-step's first units gathered across the micro-step boundary: issued by step() on the gather stream
// (after the optimizer's writes at the boundary) or, within the accumulation window, kept from their last use, as
// many as stage3_prefetch_bucket_size and stage3_max_live_parameters allow (support/boundary_prefetch.hpp), and
// found gathered by the next micro-step's scopes.
// zero3-test-ranks: 1 2
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "device/device_kernels.hpp"
#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/stream_path_checks.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

// A model whose every operation is queued on the device's compute stream: forward adds each unit's parameters
// into an activation buffer; backward writes scale * parameters as the unit's gradient, scale depending on the
// rank and the micro-step, so the optimizer has something to do and a missing wait shows in the numbers.
class QueuedModel {
 public:
  QueuedModel(Engine& engine, std::vector<UnitId> units) : engine_(engine), units_(std::move(units)) {
    Device& d = engine.device();
    for (UnitId u : units_) act_numel_ = std::max(act_numel_, engine.unit(u).numel);
    act_ = static_cast<float*>(d.allocate(static_cast<size_t>(act_numel_) * sizeof(float)));
    d.fill_zero(act_, static_cast<size_t>(act_numel_) * sizeof(float), d.default_stream());
  }
  ~QueuedModel() {
    Device& d = engine_.device();
    d.deallocate_after(act_, static_cast<size_t>(act_numel_) * sizeof(float), d.default_stream());
  }

  void micro_step(int64_t index) {
    Device& d = engine_.device();
    detail::DeviceKernels& k = detail::kernels_of(d);
    const Stream s = d.default_stream();
    for (UnitId u : units_) {
      UnitScope scope = engine_.forward_scope(u);
      const TensorView p = scope.flat_params();
      k.scale_add(act_, DType::f32, p.data, p.dtype, 1.0f, p.numel, s);
      scope.close();
    }
    const float scale = 0.01f * static_cast<float>(1 + engine_.rank()) + 0.001f * static_cast<float>(index % 5);
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
      UnitScope scope = engine_.backward_scope(*it);
      const TensorView p = scope.flat_params();
      const TensorView g = scope.flat_grads();
      k.scale_copy(g.data, g.dtype, p.data, p.dtype, scale, p.numel, s);
      scope.close();
    }
  }

 private:
  Engine& engine_;
  std::vector<UnitId> units_;
  int64_t act_numel_ = 1;
  float* act_ = nullptr;
};

struct Variant {
  std::string name;
  bool bf16;
  bool offload;  // optimizer and parameters to pinned host memory (the seed's Llama-3-8B setting)
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// Buckets of 64 elements: each unit's gradient spans several, so a unit's reduction can be in flight in pieces.
constexpr int64_t kBucketNumel = 64;

Config config_of(const Variant& v) {
  Config c = equivalence_config(3);
  c.zero.reduce_bucket_size = kBucketNumel;
  c.bf16.enabled = v.bf16;
  if (v.offload) {
    for (OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
      o->device = OffloadDevice::cpu;
      o->pin_memory = true;
    }
  }
  return c;
}

// The counts of one micro-step (its scopes and its step()).
struct MicroStep {
  bool boundary = false;
  HostSyncs syncs;
  int64_t device_allocations = 0;
  int64_t host_allocations = 0;
  int64_t allocations = 0;
  int64_t collectives = 0;          // all-gathers and reductions the comm saw issued on the engine's streams
  int64_t units_with_elements = 0;  // units of which this rank owns elements
  int64_t optimizer_tiles = 0;      // their sub_group_size tiles
  int64_t gathers_in_step = 0;      // all-gathers step() issued on the engine's gather stream
  int64_t persistent_units = 0;     // re-gathered by step() after the optimizer step
  int64_t boundary_prefetches = 0;  // ScheduleStats over the micro-step and its step()
  int64_t boundary_keeps = 0;
  int64_t prefetch_hits = 0;
  int64_t first_units = 0;  // what the budget allows: next_micro_step_first_units() after step()
};

struct Measured {
  std::vector<MicroStep> steady;
  std::map<std::string, std::vector<float>> params;
  std::vector<double> grad_norms;
  StreamPathUsage usage;
};

constexpr int64_t kWarmupSteps = 2;  // optimizer steps before the steady state
constexpr int64_t kSteps = 5;

// Trains the queued model for kSteps optimizer steps on `device` (a StreamPathDevice, or the cpu device when
// `path` is null) and measures every micro-step after the warm-up.
Measured train(const Variant& v, Device& device, StreamPathDevice* path, std::shared_ptr<Communicator> comm,
               StreamPathComm* path_comm) {
  Measured run;
  const Config c = resolved_for(config_of(v), *comm);
  Engine engine(c, comm, device);
  const MlpUnits mlp = declare_mlp(engine, MlpDims{});
  engine.materialize();
  QueuedModel model(engine, {mlp.fc1, mlp.norm, mlp.fc2, mlp.head});
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t i = 0; i < kSteps * gas; ++i) {
    const bool measured = i >= kWarmupSteps * gas;
    StreamPathUsage before;
    int64_t collectives_before = 0;
    if (path != nullptr) {
      before = path->usage();
      collectives_before = path_comm->side_stream_gathers() + path_comm->side_stream_reductions();
    }
    const ScheduleStats stats_before = engine.schedule_stats();
    model.micro_step(i);
    const int64_t gathers_before_step = path != nullptr ? path_comm->side_stream_gathers() : 0;
    const StepResult r = engine.step();
    const ScheduleStats stats_after = engine.schedule_stats();
    if (r.boundary) run.grad_norms.push_back(r.grad_norm);
    if (path == nullptr || !measured) continue;
    const StreamPathUsage after = path->usage();
    MicroStep m;
    m.boundary = r.boundary;
    m.syncs = after.host_syncs - before.host_syncs;
    m.device_allocations = after.device_allocations - before.device_allocations;
    m.host_allocations = after.host_allocations - before.host_allocations;
    m.allocations = after.allocations - before.allocations;
    m.collectives = path_comm->side_stream_gathers() + path_comm->side_stream_reductions() - collectives_before;
    m.gathers_in_step = path_comm->side_stream_gathers() - gathers_before_step;
    m.boundary_prefetches = stats_after.boundary_prefetches - stats_before.boundary_prefetches;
    m.boundary_keeps = stats_after.boundary_keeps - stats_before.boundary_keeps;
    m.prefetch_hits = stats_after.prefetch_hits - stats_before.prefetch_hits;
    m.first_units = static_cast<int64_t>(next_micro_step_first_units(engine).size());
    for (size_t u = 0; u < engine.num_units(); ++u) {
      const SliceInfo sl = engine.slice(UnitId{static_cast<int32_t>(u)}, engine.rank());
      if (sl.valid == 0) continue;
      if (engine.unit(UnitId{static_cast<int32_t>(u)}).persistent) m.persistent_units++;
      m.units_with_elements++;
      m.optimizer_tiles += (sl.valid + c.zero.sub_group_size - 1) / c.zero.sub_group_size;
    }
    run.steady.push_back(m);
  }
  run.params = gather_params(engine);
  if (path != nullptr) {
    path->synchronize();
    run.usage = path->usage();
  }
  return run;
}

class GpuCosts : public ::testing::TestWithParam<Variant> {};

// What a micro-step may cost in steady state (docs/gpu.md, "Host synchronizations", says why each remains):
//   within the accumulation window: nothing the host waits for, and no device allocation;
//   the boundary: one event synchronization (the agreed Inf/NaN count and norm, with the window's schedule
//     agreement, read together; the optimizer step needs them on the host), and with offload one more per
//     optimizer tile (its gradients reach the host for the CPU Adam);
//   every collective waited for at most once, and only when the host is not already past it.
void expect_steady_state_costs(const Variant& v, const std::vector<MicroStep>& steady) {
  int64_t boundaries = 0;
  for (const MicroStep& m : steady) {
    SCOPED_TRACE(m.boundary ? "boundary micro-step" : "micro-step within the accumulation window");
    boundaries += m.boundary ? 1 : 0;
    EXPECT_EQ(m.device_allocations, 0) << "the stream-ordered pool grew in steady state";
    EXPECT_EQ(m.host_allocations, 0) << "the pinned host cache grew in steady state";
    EXPECT_EQ(m.syncs.device_synchronize, 0);
    EXPECT_EQ(m.syncs.stream_synchronize, 0) << "the collective guard compared a call in steady state";
    EXPECT_EQ(m.syncs.pageable_copies, 0);
    EXPECT_EQ(m.syncs.blocking_kernels, 0);
    EXPECT_EQ(m.syncs.synchronous_copies, 0);
    EXPECT_EQ(m.syncs.collective_waits, 0);
    if (!m.boundary) {
      EXPECT_EQ(m.syncs.total(), 0) << m.syncs;
      continue;
    }
    EXPECT_EQ(m.syncs.event_synchronize, 1 + (v.offload ? m.optimizer_tiles : 0)) << m.syncs;
  }
  EXPECT_GT(boundaries, 0);
}

// The next micro-step's first units cross the boundary: all of them, every micro-step. At the boundary step()
// releases every unit and, after the optimizer step (and the persistent units' re-gathers), issues their gathers
// on the gather stream; within the window they are kept from their backward, or gathered where they were not.
void expect_boundary_prefetch(const std::vector<MicroStep>& steady) {
  for (size_t i = 0; i < steady.size(); ++i) {
    const MicroStep& m = steady[i];
    SCOPED_TRACE(m.boundary ? "boundary micro-step" : "micro-step within the accumulation window");
    EXPECT_GT(m.first_units, 0);
    EXPECT_EQ(m.boundary_prefetches + m.boundary_keeps, m.first_units) << "not every first unit crossed";
    if (m.boundary) {
      EXPECT_EQ(m.boundary_keeps, 0) << "a unit kept across the optimizer step";
      EXPECT_EQ(m.boundary_prefetches, m.first_units);
      EXPECT_EQ(m.gathers_in_step, m.persistent_units + m.boundary_prefetches)
          << "the boundary prefetches were not issued on the gather stream by step()";
    } else {
      EXPECT_EQ(m.boundary_prefetches, 0) << "within the window the first units are kept, not gathered again";
      EXPECT_EQ(m.gathers_in_step, 0);
    }
    if (i > 0) {
      // Every unit that crossed was found gathered by this micro-step's scopes.
      EXPECT_GE(m.prefetch_hits, steady[i - 1].boundary_prefetches + steady[i - 1].boundary_keeps);
    }
  }
}

TEST_P(GpuCosts, HostSyncsAndDeviceAllocationsPerMicroStepInSteadyState) {
  const Variant& v = GetParam();
  Measured reference = train(v, cpu_device(), nullptr, engine_world(), nullptr);
  for (ComputeStream compute : {ComputeStream::legacy, ComputeStream::callers}) {
    for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
      SCOPED_TRACE(
          std::string(compute == ComputeStream::legacy ? "legacy default stream" : "caller's stream") +
          (schedule == StreamSchedule::lazy ? ", side streams run when waited for" : ", side streams run at once"));
      StreamPathDevice device(schedule, compute);
      auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
      Measured run = train(v, device, &device, comm, comm.get());
      EXPECT_EQ(run.params, reference.params) << "the stream path changed the numbers";
      EXPECT_EQ(run.grad_norms, reference.grad_norms);
      expect_gpu_ordering_rules(run.usage, *comm);
      EXPECT_GT(run.usage.compute_stream_ops, 0);
      ASSERT_EQ(run.steady.size(), static_cast<size_t>((kSteps - kWarmupSteps) * 2));
      expect_steady_state_costs(v, run.steady);
      expect_boundary_prefetch(run.steady);
      // The reducer's ring: the compute stream goes on with more than two reductions unwaited for (a unit's
      // gradient spans several buckets here, and the ring holds the largest unit's).
      EXPECT_GT(run.usage.max_reductions_in_flight, 2);
      if (compute == ComputeStream::legacy && schedule == StreamSchedule::lazy) {
        // The figures docs/gpu.md quotes.
        for (size_t i = 0; i < 2; ++i) {
          const MicroStep& m = run.steady[i];
          std::printf(
              "[%s, rank %d/%d] %s micro-step: host syncs %s; device allocations %lld (of %lld served by "
              "the pool); collectives issued %lld; reductions in flight at most %lld; first units across the "
              "boundary %lld (%lld gathered by step(), %lld kept)\n",
              v.name.c_str(), comm->rank(), comm->size(), m.boundary ? "boundary" : "in-window",
              (std::ostringstream() << m.syncs).str().c_str(), static_cast<long long>(m.device_allocations),
              static_cast<long long>(m.allocations), static_cast<long long>(m.collectives),
              static_cast<long long>(run.usage.max_reductions_in_flight), static_cast<long long>(m.first_units),
              static_cast<long long>(m.boundary_prefetches), static_cast<long long>(m.boundary_keeps));
        }
      }
    }
  }
}

const Variant kVariants[] = {
    {"stage3", false, false},
    {"stage3_bf16", true, false},
    {"stage3_bf16_offload", true, true},
};

INSTANTIATE_TEST_SUITE_P(Engine, GpuCosts, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace

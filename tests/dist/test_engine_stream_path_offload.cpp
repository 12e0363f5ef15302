// Offload on the engine's stream path (what it does on a cuda device), run on the CPU through the stream-path
// test device (support/stream_path_device.hpp: host memory told apart as device, pinned and pageable; stream
// work runs only when waited for, or side streams' work at once: both schedules run): optimizer offload to cpu and
// nvme, parameter offload to cpu and nvme, both, at stages 1-3, in fp32 and bf16, with one tile per unit or many.
//
// Each run must be bit-identical to the same engine without offload on the cpu device (as
// test_equivalence_offload.cpp checks the cpu device's offload) and close to the reference model. The device
// checks the GPU's rules: no stream or host waits on an event never recorded, no memory freed while queued
// work uses it, no kernel or collective on host memory, no asynchronous copy from pageable memory when
// pin_memory is set; and that the step's gradient tiles come down and its compute copies go up on two streams
// of their own, with the next tile already queued when the host waits for one. The master weights and moments
// (and the parameter slices) must be in host memory, pinned when pin_memory says so, and the engine's device and
// host counters must equal the memory plan for a GPU, which counts them independently from shapes.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <ostream>
#include <set>
#include <string>

#include "offload/swap_file.hpp"
#include "support/boundary_prefetch.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_model_desc.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/offload_tiers.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/reference_model.hpp"
#include "support/stream_path_checks.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Variant {
  std::string name;
  int stage;
  Where optimizer;
  Where param;
  bool bf16;
  int64_t sub_group_size;
  bool pin = true;          // pin_memory of both sections
  bool accum_bf16 = false;  // data_types.grad_accum_dtype bf16
  double tolerance = 1e-5;  // against the reference model
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

Config base_config(const Variant& v) {
  Config c = equivalence_config(v.stage);
  c.bf16.enabled = v.bf16;
  c.communication_data_type = DType::f32;  // the reference's exact sums: the bf16 bound
  c.zero.sub_group_size = v.sub_group_size;
  if (v.accum_bf16) c.grad_accum_dtype = DType::bf16;
  return c;
}

// Planned bytes of `cat` in `tier`, leaving out entries whose description contains any of `transient`.
int64_t planned(const MemoryPlan& p, MemoryCategory cat, MemoryTier tier,
                std::initializer_list<const char*> transient) {
  int64_t total = 0;
  for (const auto& e : p.entries) {
    if (e.category != cat || e.tier != tier) continue;
    bool skip = false;
    for (const char* t : transient) skip |= e.what.find(t) != std::string::npos;
    if (!skip) total += e.bytes;
  }
  return total;
}

class StreamPathOffload : public ::testing::TestWithParam<Variant> {};

TEST_P(StreamPathOffload, BitIdenticalToNoOffloadOrderedAndCounted) {
  const Variant& v = GetParam();
  RankTempDir dir;
  const Config base = base_config(v);
  Config off = base;
  apply_offload(off, v.optimizer, v.param, v.pin, dir.path());
  TrainPlan plan;
  plan.world = engine_world()->size();
  plan.steps = 6;

  EngineRun want;
  MemoryStats want_memory;
  {
    Engine engine(resolved_for(base, *engine_world()), engine_world(), cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    want = train_mlp(engine, units, plan);
    want_memory = engine.memory();
  }

  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "side streams run when waited for" : "side streams run at once");
    StreamPathDevice device(schedule);
    auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
    EngineRun got;
    MemoryStats initial, final_memory;
    int64_t pinned_in_use = 0, device_in_use = 0, gathered_persistent = 0, gathered_ahead = 0, largest_slice = 0;
    int64_t slices_read_ahead = 0;
    ModelDesc model;
    {
      Engine engine(resolved_for(off, *comm), comm, device);
      MlpUnits units = declare_mlp(engine, plan.dims);
      model = model_desc_of(engine);
      engine.materialize();
      initial = engine.memory();
      got = train_mlp(engine, units, plan);
      device.synchronize();
      final_memory = engine.memory();
      pinned_in_use = device.host_bytes_in_use();
      device_in_use = device.bytes_in_use();
      for (size_t i = 0; i < engine.num_units(); ++i) {
        const UnitInfo& u = engine.unit(UnitId{static_cast<int32_t>(i)});
        if (u.persistent) gathered_persistent += u.padded_numel * static_cast<int64_t>(dtype_size(u.dtype));
        largest_slice = std::max(largest_slice, u.slice_numel);
      }
      gathered_ahead = gathered_bytes(engine, next_micro_step_first_units(engine));
      // NVMe parameter offload: the slices of those first units come up from host memory, which holds them until
      // their gathers are waited for (at the next micro-step's first scopes).
      if (v.param == Where::nvme) {
        for (UnitId id : next_micro_step_first_units(engine)) {
          slices_read_ahead += engine.unit(id).slice_numel * static_cast<int64_t>(dtype_size(engine.unit(id).dtype));
        }
      }
    }
    EXPECT_EQ(device.bytes_in_use(), 0) << "the engine left device memory behind";
    EXPECT_EQ(device.host_bytes_in_use(), 0) << "the engine left pinned memory behind";
    EXPECT_FALSE(std::filesystem::exists(offload::swap_file_path(dir.path(), "optimizer", comm->rank())));
    EXPECT_FALSE(std::filesystem::exists(offload::swap_file_path(dir.path(), "param", comm->rank())));

    // The numbers: bit for bit those of the cpu device without offload, and close to the reference.
    expect_same_run(got, want);
    ReferenceRun ref = run_reference(base, plan);
    std::string worst;
    EXPECT_LE(max_relative_error(got.params, ref.params, &worst), v.tolerance) << "largest difference at " << worst;

    // The GPU's rules.
    const StreamPathUsage u = device.usage();
    expect_gpu_ordering_rules(u, *comm);
    if (v.pin) {
      EXPECT_EQ(u.pageable_async_copies, 0) << "an asynchronous copy used pageable memory";
    }
    const bool optimizer_off = v.optimizer != Where::none;
    const bool param_off = v.param != Where::none;
    if (optimizer_off) {
      EXPECT_GT(u.d2h_copies_on_side_streams, 0) << "no gradient tile came down on a copy stream";
      if (!param_off) {
        EXPECT_GT(u.h2d_copies_on_side_streams, 0) << "no compute copy went up on a copy stream";
        // (The engine's collective check copies its few floats up and down on a stream of its own.)
        const std::set<Stream> collective_streams = comm->collective_streams();
        for (Stream s : u.h2d_streams) {
          if (collective_streams.count(s)) continue;
          EXPECT_EQ(u.d2h_streams.count(s), 0u) << "both directions on one stream";
        }
      }
      // With several tiles, the next tile's gradients are queued before the host waits for the current one's.
      EXPECT_GT(u.host_waits_with_work_behind, 0);
    }
    if (param_off && v.pin) {
      EXPECT_GT(u.h2d_copies_on_side_streams, 0) << "no parameter slice went up on a stream";
    }

    // Where the state lives.
    if (v.optimizer == Where::cpu) {
      EXPECT_EQ(initial.optimizer_state, 0);
      EXPECT_EQ(initial.master, 0);
      EXPECT_GT(initial.host_master, 0);
      EXPECT_EQ(initial.host_optimizer_state, 2 * initial.host_master);
    }
    if (v.optimizer == Where::nvme) {
      EXPECT_EQ(initial.optimizer_state + initial.host_optimizer_state, 0);
      EXPECT_EQ(initial.master + initial.host_master, 0);
    }
    if (v.param == Where::cpu) {
      EXPECT_GT(initial.host_params, 0);
    }
    if (v.param == Where::nvme) {
      EXPECT_EQ(final_memory.host_params, slices_read_ahead);
      if (v.stage == 3) {
        EXPECT_GT(slices_read_ahead, 0);
      }
    }
    if (v.param == Where::nvme && v.optimizer == Where::none) {
      // The step rebuilds one unit's slice at a time: the host never holds every slice of the rank at once.
      int64_t all_slices = 0;
      for (const UnitDesc& d : model.units) {
        int64_t numel = 0;
        for (const auto& shape : d.params) {
          int64_t n = 1;
          for (int64_t e : shape) n *= e;
          numel += n;
        }
        all_slices += (numel + comm->size() - 1) / comm->size() * static_cast<int64_t>(v.bf16 ? 2 : 4);
      }
      EXPECT_LT(final_memory.peak_host_total, all_slices);
    }
    // The step's fp32 gradient tile, for a bf16 accumulator: pageable (only the host touches it).
    const int64_t scratch = v.accum_bf16 ? std::min(v.sub_group_size, largest_slice) * 4 : 0;
    if (v.pin) {
      EXPECT_EQ(pinned_in_use, final_memory.host_total() - scratch) << "pin_memory: host state must be pinned";
    } else {
      EXPECT_EQ(pinned_in_use, final_memory.host_buffers - scratch) << "without pin_memory only the staging is pinned";
    }
    // The device holds exactly what the engine accounts for, less than without offload (fp32 with parameter
    // offload alone moves nothing: the device optimizer's master stays beside the host slice).
    EXPECT_EQ(device_in_use, final_memory.total());
    if (v.bf16 || optimizer_off) {
      EXPECT_LT(final_memory.total(), want_memory.total());
    } else {
      EXPECT_EQ(final_memory.total(), want_memory.total());
    }

    // The counters against the memory plan for a GPU, between steps: without the transient entries (gathered
    // units, the backward scope's buffer, step-only tiles), NVMe staging (the swapper's own) and NVMe slices. At
    // stage 3 the last step() left the next micro-step's first units gathered besides the persistent ones (a part
    // of the plan's worst case of gathered units).
    MemoryPlanOptions po;
    po.world_size = comm->size();
    const MemoryPlan mp = plan_memory(model, off, po);
    const auto dev = MemoryTier::device;
    const auto host = MemoryTier::host;
    EXPECT_EQ(final_memory.params, planned(mp, MemoryCategory::params, dev, {"worst case"}) + gathered_ahead);
    EXPECT_EQ(final_memory.gathered, gathered_persistent + gathered_ahead);
    if (v.stage == 3) {
      EXPECT_GT(gathered_ahead, 0);
      EXPECT_LE(gathered_ahead, planned(mp, MemoryCategory::params, dev, {}) -
                                    planned(mp, MemoryCategory::params, dev, {"worst case"}));
    }
    EXPECT_EQ(final_memory.master, planned(mp, MemoryCategory::master, dev, {}));
    EXPECT_EQ(final_memory.grads, planned(mp, MemoryCategory::grads, dev, {"backward scope"}));
    EXPECT_EQ(final_memory.optimizer_state, planned(mp, MemoryCategory::optimizer_state, dev, {}));
    EXPECT_EQ(final_memory.buffers, planned(mp, MemoryCategory::buffers, dev, {"step tile"}));
    EXPECT_EQ(final_memory.host_params, planned(mp, MemoryCategory::params, host, {}) + slices_read_ahead);
    EXPECT_EQ(final_memory.host_master, planned(mp, MemoryCategory::master, host, {}));
    EXPECT_EQ(final_memory.host_optimizer_state, planned(mp, MemoryCategory::optimizer_state, host, {}));
    EXPECT_EQ(final_memory.host_buffers, planned(mp, MemoryCategory::buffers, host, {"NVMe staging"}));
  }
}

// bf16 bounds: test_equivalence_options.cpp explains 5e-3 (and 3e-2 with a bf16 accumulator).
const Variant kVariants[] = {
    {"stage1_optimizer_cpu", 1, Where::cpu, Where::none, false, 1'000'000'000},
    {"stage2_optimizer_cpu_bf16_tiles", 2, Where::cpu, Where::none, true, 17, true, false, 5e-3},
    {"stage3_optimizer_cpu_bf16_tiles_pageable", 3, Where::cpu, Where::none, true, 17, false, false, 5e-3},
    {"stage3_optimizer_cpu_tiles", 3, Where::cpu, Where::none, false, 33},
    {"stage2_optimizer_cpu_accum_bf16", 2, Where::cpu, Where::none, true, 50, true, true, 3e-2},
    {"stage1_optimizer_nvme_tiles", 1, Where::nvme, Where::none, false, 100},
    {"stage3_optimizer_nvme_bf16", 3, Where::nvme, Where::none, true, 1'000'000'000, true, false, 5e-3},
    {"stage3_optimizer_nvme_tiles", 3, Where::nvme, Where::none, false, 33},
    {"stage3_param_cpu_bf16", 3, Where::none, Where::cpu, true, 50, true, false, 5e-3},
    {"stage3_param_cpu_pageable", 3, Where::none, Where::cpu, false, 1'000'000'000, false},
    {"stage3_param_nvme", 3, Where::none, Where::nvme, false, 40},
    {"stage3_both_cpu_bf16", 3, Where::cpu, Where::cpu, true, 1'000'000'000, true, false, 5e-3},
    {"stage3_both_cpu_bf16_tiles", 3, Where::cpu, Where::cpu, true, 23, true, false, 5e-3},
    {"stage3_both_cpu_tiles_pageable", 3, Where::cpu, Where::cpu, false, 29, false},
    {"stage3_both_nvme_bf16_tiles", 3, Where::nvme, Where::nvme, true, 23, true, false, 5e-3},
    {"stage3_optimizer_nvme_param_cpu_bf16", 3, Where::nvme, Where::cpu, true, 40, true, false, 5e-3},
};

INSTANTIATE_TEST_SUITE_P(Offload, StreamPathOffload, ::testing::ValuesIn(kVariants), variant_name);

// A checkpoint saved on the stream path with offload (local_shard hands out host memory, or reads the swap file)
// and loaded into a fresh engine (refresh_params rebuilds the compute copies from host memory) goes on
// bit-identically.
TEST(StreamPathOffloadCheckpoint, ResumeIsBitIdentical) {
  RankTempDir swap_dir;
  SharedTempDir ckpt(*engine_world(), "zero3-stream-offload-ckpt");
  const Variant cases[] = {
      {"both_cpu_bf16", 3, Where::cpu, Where::cpu, true, 40},
      {"both_nvme_bf16", 3, Where::nvme, Where::nvme, true, 40},
      {"optimizer_cpu_fp32_stage2", 2, Where::cpu, Where::none, false, 40},
  };
  for (const Variant& v : cases) {
    SCOPED_TRACE(v.name);
    StreamPathDevice device;
    auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
    Config c = base_config(v);
    apply_offload(c, v.optimizer, v.param, v.pin, swap_dir.path());
    TrainPlan plan;
    plan.world = comm->size();

    MlpEngine whole = make_mlp_engine(c, comm, device, plan.dims);
    train_steps(*whole.engine, whole.units, plan, 0, 3);
    save_checkpoint(*whole.engine, ckpt.path(), v.name);
    std::vector<double> want = train_steps(*whole.engine, whole.units, plan, 3, 3);
    whole.engine.reset();

    MlpEngine resumed = make_mlp_engine(c, comm, device, plan.dims);
    load_checkpoint(*resumed.engine, ckpt.path(), v.name);
    std::vector<double> got = train_steps(*resumed.engine, resumed.units, plan, 3, 3);
    EXPECT_EQ(got, want);
    resumed.engine.reset();
    const StreamPathUsage u = device.usage();
    EXPECT_EQ(u.waits_before_record + u.syncs_before_record + u.frees_while_queued + u.kernels_on_host_memory, 0);
    EXPECT_EQ(comm->host_memory_collectives(), 0);
  }
}

// Parameter offload on a GPU needs stage 3, named in the error, before anything is allocated.
TEST(StreamPathOffloadConfig, ParamOffloadNeedsStageThree) {
  StreamPathDevice device;
  auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
  Config c = equivalence_config(2);
  c.zero.offload_param.device = OffloadDevice::cpu;
  try {
    Engine engine(resolved_for(c, *comm), comm, device);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.device"), std::string::npos) << e.what();
  }
}

}  // namespace

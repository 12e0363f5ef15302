// NVMe parameter offload reads the slices ahead of their all-gathers along the recorded schedule: a chain of
// eight units trained with offload_param nvme and 1, 2 or 4 read buffers must give bit for bit the parameters
// and forward values of the same run without parameter offload, with every all-gather fed by one read and
// reads started ahead (with 2 buffers or more, every read after the first micro-step but those of the first unit
// gathered at the end of an optimizer step; none with stage3_prefetch_bucket_size 0, where each read is waited for
// at its gather).
//
// Faults: the swap file truncated under the engine, in the first micro-step (reads only on demand) or after a
// step with reads ahead in flight, fails the next all-gather that needs a lost slice, on every rank at the
// same gather, as an IoError naming the unit, the file, the offset and the size; every later call rethrows
// it, and the engine closes without hanging.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "offload/swap_file.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

constexpr int kUnits = 8;

// Sizes above the persistence threshold (40), with slices under 2048 bf16 elements at any world size: each
// unit's tile in the swap file is 4096 bytes, unit i at offset 4096 * i.
int64_t unit_numel(int i) { return 300 + 53 * i; }

std::vector<UnitId> declare_chain(Engine& engine) {
  std::vector<UnitId> units;
  for (int i = 0; i < kUnits; ++i) {
    UnitId u = engine.add_unit("layer" + std::to_string(i));
    engine.add_param(u, {"w", {unit_numel(i)}, ParamInit::normal(0.02)});
    units.push_back(u);
  }
  return units;
}

Config chain_config() {
  Config c = equivalence_config(3);
  c.bf16.enabled = true;
  c.zero.prefetch_bucket_size = 1;  // one unit's gather ahead
  c.zero.max_reuse_distance = 0;    // every unit is gathered again for its backward, except the last
  c.steps_per_print = 0;
  return c;
}

void offload_params(Config& c, const std::string& dir, int64_t buffers) {
  c.zero.offload_param.device = OffloadDevice::nvme;
  c.zero.offload_param.nvme_path = dir;
  c.zero.offload_param.buffer_count = buffers;
  c.zero.offload_param.buffer_size = 10'000;
}

// One micro-step: the forward scopes sum each unit's parameters; the backward scopes pull the weights towards
// a target of this rank and micro-step, scaled by what the forward saw (a slice read wrong changes both).
// Returns the forward sums.
std::vector<double> chain_micro_step(Engine& engine, const std::vector<UnitId>& units, int64_t micro) {
  std::vector<double> sums(units.size(), 0.0);
  for (size_t i = 0; i < units.size(); ++i) {
    UnitScope s = engine.forward_scope(units[i]);
    TensorView w = s.param("w");
    for (int64_t j = 0; j < w.numel; ++j) sums[i] += bf16_to_f32(w.as<uint16_t>()[j]);
  }
  const int rank = engine.rank();
  for (size_t k = units.size(); k-- > 0;) {
    UnitScope s = engine.backward_scope(units[k]);
    TensorView w = s.param("w");
    TensorView g = s.grad("w");
    for (int64_t j = 0; j < w.numel; ++j) {
      float target = 0.01f * static_cast<float>((static_cast<int64_t>(k) * 7 + j * 3 + micro * 5 + rank) % 11 - 5);
      g.as<float>()[j] = (bf16_to_f32(w.as<uint16_t>()[j]) - target) * (1.0f + 0.01f * static_cast<float>(sums[k]));
    }
  }
  return sums;
}

struct ChainRun {
  std::vector<std::vector<double>> sums;  // per micro-step
  std::map<std::string, std::vector<float>> params;
  ScheduleStats stats;  // after the first micro-step, which records the order
};

ChainRun run_chain(const Config& c, int64_t micro_steps) {
  Engine engine(resolved_for(c, *engine_world()), engine_world(), cpu_device());
  std::vector<UnitId> units = declare_chain(engine);
  engine.materialize();
  ChainRun run;
  for (int64_t m = 0; m < micro_steps; ++m) {
    run.sums.push_back(chain_micro_step(engine, units, m));
    engine.step();
    if (m == 0) engine.reset_schedule_stats();
  }
  run.stats = engine.schedule_stats();
  run.params = gather_params(engine);
  return run;
}

void expect_same_training(const ChainRun& got, const ChainRun& want) {
  ASSERT_EQ(got.sums.size(), want.sums.size());
  for (size_t m = 0; m < got.sums.size(); ++m) EXPECT_EQ(got.sums[m], want.sums[m]) << "micro-step " << m;
  EXPECT_EQ(first_bit_difference(got.params, want.params), "");
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ParamPrefetch, ReadsRunAheadOfTheGathersWithAnyBufferCount) {
  RankTempDir dir;
  const int64_t micro_steps = 8;  // 4 optimizer steps
  const ChainRun want = run_chain(chain_config(), micro_steps);
  EXPECT_EQ(want.stats.param_reads, 0);

  for (int64_t buffers : {1, 2, 4}) {
    SCOPED_TRACE("buffer_count " + std::to_string(buffers));
    Config c = chain_config();
    offload_params(c, dir.path(), buffers);
    const ChainRun got = run_chain(c, micro_steps);
    expect_same_training(got, want);
    const ScheduleStats& s = got.stats;
    // Every all-gather is fed by one read (no unit is persistent).
    EXPECT_EQ(s.param_reads, s.all_gathers);
    // Per micro-step 2 * kUnits - 1 gathers, of which layer0's: within the accumulation window layer0 stays
    // gathered from its backward into the next micro-step; after each optimizer step it is gathered at once, by
    // step(), from its new slice.
    EXPECT_EQ(s.all_gathers, (micro_steps - 1) * (2 * kUnits - 2) + micro_steps / 2);
    EXPECT_EQ(s.boundary_prefetches, micro_steps / 2);
    EXPECT_EQ(s.boundary_keeps, micro_steps / 2 - 1);
    EXPECT_GE(s.param_read_wait_seconds, 0.0);
    // Between scope entries one buffer feeds a gather (the next unit's, prefetched). With one buffer a read
    // starts ahead only at the end of a step() that kept layer0 (layer1's); with two or more every unit's read
    // starts at least one unit ahead of its gather, except layer0's after an optimizer step (step() gathers it
    // at once, its read waited for there).
    EXPECT_EQ(s.param_reads_ahead, buffers == 1 ? micro_steps / 2 - 1 : s.param_reads - micro_steps / 2);
    if (engine_world()->rank() == 0) {
      std::printf("buffer_count %lld: %lld reads, %lld started ahead, %.3f ms waited\n",
                  static_cast<long long>(buffers), static_cast<long long>(s.param_reads),
                  static_cast<long long>(s.param_reads_ahead), s.param_read_wait_seconds * 1e3);
    }
  }

  // Without prefetch every read starts at its gather and is waited for there.
  Config c = chain_config();
  c.zero.prefetch_bucket_size = 0;
  offload_params(c, dir.path(), 4);
  const ChainRun got = run_chain(c, micro_steps);
  expect_same_training(got, want);
  EXPECT_EQ(got.stats.param_reads, got.stats.all_gathers);
  EXPECT_EQ(got.stats.param_reads_ahead, 0);
}

// The first micro-step has no recorded order, so nothing is read ahead: a slice lost between two scopes is
// missed at the next unit's gather on every rank, which then issues nothing the others would wait for.
TEST(ParamPrefetch, TruncatedSwapFailsTheNextGatherInTheFirstMicroStep) {
  RankTempDir dir;
  Config c = chain_config();
  offload_params(c, dir.path(), 2);
  Engine engine(resolved_for(c, *engine_world()), engine_world(), cpu_device());
  std::vector<UnitId> units = declare_chain(engine);
  engine.materialize();
  const std::string swap = offload::swap_file_path(dir.path(), "param", engine.rank());
  { UnitScope s = engine.forward_scope(units[0]); }
  { UnitScope s = engine.forward_scope(units[1]); }
  ASSERT_EQ(::truncate(swap.c_str(), 0), 0);
  std::string msg = what_of([&] { UnitScope s = engine.forward_scope(units[2]); });
  ASSERT_NE(msg, "") << "expected an IoError at the gather of layer2";
  EXPECT_NE(msg.find("all_gather of unit 'layer2' on rank " + std::to_string(engine.rank())), std::string::npos) << msg;
  EXPECT_NE(msg.find(swap), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 8192, 4096 bytes"), std::string::npos) << msg;
  // The engine is failed: every later call rethrows the same error.
  EXPECT_EQ(what_of([&] { UnitScope s = engine.forward_scope(units[3]); }), msg);
  EXPECT_EQ(what_of([&] { engine.step(); }), msg);
}

// With the order recorded, the next micro-step's first unit is gathered at the end of step() and the slices of
// the units after it are read ahead along the schedule (as many as there are free buffers). The file is cut
// after unit 3's slice right after an optimizer step (layer0 gathered, layer1-3 read ahead at most), so every
// read of units 4-7 starts after the cut: unit 4's read, started ahead, fails at unit 4's all-gather (issued
// ahead as the prefetch in layer3's forward_scope) on every rank.
TEST(ParamPrefetch, FailedReadAheadSurfacesAtItsGatherOnEveryRank) {
  RankTempDir dir;
  for (int64_t buffers : {1, 2, 4}) {
    SCOPED_TRACE("buffer_count " + std::to_string(buffers));
    Config c = chain_config();
    offload_params(c, dir.path(), buffers);
    Engine engine(resolved_for(c, *engine_world()), engine_world(), cpu_device());
    std::vector<UnitId> units = declare_chain(engine);
    engine.materialize();
    const std::string swap = offload::swap_file_path(dir.path(), "param", engine.rank());
    for (int64_t m = 0; m < 4; ++m) {
      chain_micro_step(engine, units, m);
      engine.step();
    }
    EXPECT_GT(engine.schedule_stats().param_reads_ahead, 0);
    ASSERT_EQ(::truncate(swap.c_str(), 4 * 4096), 0);
    std::string msg;
    int failed_at = -1;
    for (int i = 0; i < kUnits && msg.empty(); ++i) {
      msg = what_of([&] { UnitScope s = engine.forward_scope(units[static_cast<size_t>(i)]); });
      if (!msg.empty()) failed_at = i;
    }
    ASSERT_NE(msg, "") << "expected an IoError in the forward pass";
    EXPECT_EQ(failed_at, 3) << msg;
    EXPECT_NE(msg.find("all_gather of unit 'layer4'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(swap), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 16384, 4096 bytes"), std::string::npos) << msg;
    EXPECT_EQ(what_of([&] { engine.step(); }), msg);
  }
}

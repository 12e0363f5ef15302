// The memory plan against the engine it describes: the same model and config, planned from shapes and then
// trained for a few steps on 1-3 ranks, must give the engine's measured bytes per category and its measured
// peak of gathered elements (stage 3) exactly, and bound what step() leaves gathered; also under the layouts for
// slow links (hpZ's secondary partition, MiCS's buckets across the replicas, the hierarchical gather's staging) on
// simulated nodes, and with ZeRO++'s qwZ and qgZ (their messages and sums), where the most buffers the engine held
// must match the plan's too.
// zero3-test-ranks: 1 2 3
// zero3-test-nodes: 2x2 3x2
#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "plan/gather_simulation.hpp"
#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

// Units of 30, 7 (persistent at stage 3), 28 and 101 elements: no world size in 2..3 divides them all.
const std::vector<std::pair<std::string, std::vector<ParamSpec>>>& units() {
  static const std::vector<std::pair<std::string, std::vector<ParamSpec>>> u = {
      {"a", {{"w", {10, 3}, ParamInit::normal(0.1)}}},
      {"b", {{"g", {7}, ParamInit::ones()}}},
      {"c", {{"w", {5, 5}, ParamInit::normal(0.1)}, {"bias", {3}, ParamInit::zeros()}}},
      {"d", {{"w", {101}, ParamInit::uniform(-0.1, 0.1)}}},
  };
  return u;
}

ModelDesc describe() {
  ModelDesc m;
  m.name = "plan-check";
  for (const auto& [name, params] : units()) {
    UnitDesc u{name, {}};
    for (const auto& p : params) u.params.push_back(p.shape);
    m.units.push_back(std::move(u));
  }
  return m;
}

Config plan_config(int stage, bool bf16, int64_t reuse) {
  Config c = equivalence_config(stage);
  c.bf16.enabled = bf16;
  c.zero.param_persistence_threshold = 10;
  c.zero.prefetch_bucket_size = 40;
  c.zero.reduce_bucket_size = 60;
  c.zero.max_reuse_distance = reuse;
  return c;
}

int64_t planned(const MemoryPlan& p, MemoryCategory cat, const std::string& leave_out = "") {
  int64_t total = 0;
  for (const auto& e : p.entries) {
    if (e.category == cat && (leave_out.empty() || e.what.find(leave_out) == std::string::npos)) total += e.bytes;
  }
  return total;
}

// How the most buffers the engine held compares with the plan's buffers, worst cases included.
enum class PeakBuffers { at_most, equal };

void check(int stage, bool bf16, int64_t reuse, const std::function<void(Config&)>& layout = nullptr,
           PeakBuffers peak = PeakBuffers::at_most) {
  SCOPED_TRACE("stage " + std::to_string(stage) + (bf16 ? " bf16" : " fp32") + " reuse " + std::to_string(reuse) +
               (layout ? " with a layout" : ""));
  auto comm = engine_world();
  Config config = plan_config(stage, bf16, reuse);
  if (layout) layout(config);
  MemoryPlanOptions o;
  o.world_size = comm->size();
  o.ranks_per_node = detect_launch().local_world_size;
  MemoryPlan plan = plan_memory(describe(), config, o);

  Engine e(resolved_for(config, *comm), comm, cpu_device());
  std::vector<UnitId> ids;
  for (const auto& [name, params] : units()) ids.push_back(e.add_unit(name, params));
  e.materialize();
  for (int micro = 0; micro < 6; ++micro) {
    for (UnitId u : ids) {
      auto s = e.forward_scope(u);
    }
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      auto s = e.backward_scope(*it);
      TensorView g = s.flat_grads();
      for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 1e-3f * static_cast<float>(i % 5);
    }
    e.step();
  }
  MemoryStats m = e.memory();
  // Between micro-steps the gathered units and the backward scope's buffer are gone: what is left is the
  // plan without those two transient entries, the persistent units, and at stage 3 the next micro-step's first
  // units, gathered ahead by step(): within the plan's worst case of gathered units.
  const int64_t c = bf16 ? 2 : 4;
  const int64_t ahead = gathered_bytes(e, next_micro_step_first_units(e));
  EXPECT_EQ(ahead > 0, stage == 3);
  EXPECT_LE(ahead, plan.live_params * c);
  EXPECT_EQ(m.gathered, plan.persistent_params * c + ahead);
  EXPECT_EQ(m.params, planned(plan, MemoryCategory::params, "worst case") + ahead);
  EXPECT_EQ(m.master, planned(plan, MemoryCategory::master));
  EXPECT_EQ(m.grads, planned(plan, MemoryCategory::grads, "backward scope"));
  EXPECT_EQ(m.optimizer_state, planned(plan, MemoryCategory::optimizer_state));
  // The gathers of those first units are in flight until the next micro-step's scopes wait for them (the last
  // step() was an optimizer step: none was kept), each holding its scratch (qwZ's messages, MiCS's hierarchical
  // inter-node stage).
  int64_t scratch = 0;
  if (stage == 3) {
    const int pieces = config.zero.mics_shard_size > 0 ? static_cast<int>(config.zero.mics_shard_size) : comm->size();
    const int staged = config.zero.mics_hierarchical_params_gather ? pieces / o.ranks_per_node : 0;
    const QuantFormat fmt{8, config.zero3.qwz_block_size};
    for (UnitId u : next_micro_step_first_units(e)) {
      scratch += detail::gather_scratch_bytes(e.unit(u).slice_numel, pieces, staged,
                                              config.zero.quantized_weights && pieces > 1, fmt, c);
    }
  }
  EXPECT_EQ(m.buffers, planned(plan, MemoryCategory::buffers, "worst case") + scratch);
  if (peak == PeakBuffers::equal) {
    EXPECT_EQ(m.peak_buffers, planned(plan, MemoryCategory::buffers));
  } else {
    EXPECT_LE(m.peak_buffers, planned(plan, MemoryCategory::buffers));
  }
  if (stage == 3) {
    ScheduleStats s = e.schedule_stats();
    EXPECT_EQ(s.persistent_numel, plan.persistent_numel);
    EXPECT_EQ(s.peak_live_numel, plan.live_numel);
    EXPECT_EQ(m.peak_gathered, (plan.live_params + plan.persistent_params) * c);
  }
}

TEST(MemoryPlanEngine, EveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    check(stage, /*bf16=*/true, 1'000'000'000);
    check(stage, /*bf16=*/false, 1'000'000'000);
  }
}

TEST(MemoryPlanEngine, Layouts) {
  const LaunchInfo launch = detect_launch();
  const int per_node = launch.local_world_size, nodes = launch.world_size / per_node;
  if (nodes < 2) GTEST_SKIP() << "the layouts are checked on simulated nodes";
  const std::vector<std::pair<const char*, std::function<void(Config&)>>> layouts = {
      {"hsdp", [&](Config& c) { c.zero.mics_shard_size = per_node; }},
      {"mics_hierarchical",
       [&](Config& c) {
         c.zero.mics_shard_size = launch.world_size;
         c.zero.mics_hierarchical_params_gather = true;
       }},
      {"hpz", [&](Config& c) { c.zero.hpz_partition_size = per_node; }},
  };
  for (const auto& [name, layout] : layouts) {
    SCOPED_TRACE(name);
    check(3, true, 1'000'000'000, layout);
    check(3, false, 0, layout);
  }
}

// ZeRO++: qgZ's buckets (int4 messages and fp32 sums, held for good) and qwZ's gather messages (held while a gather is
// in flight). Units a, b and c persistent, so that d's gathers alone hold messages: then the most buffers the engine
// held is the plan's buffers, its worst case included, exactly; with the hierarchical gather (whose persistent units'
// staging the plan adds to d's) at most that. Every unit gathered again in backward (reuse 0), so that hpZ's gathers
// from the secondary copy run too.
TEST(MemoryPlanEngine, QuantizedCollectives) {
  const LaunchInfo launch = detect_launch();
  if (launch.world_size < 2) GTEST_SKIP() << "the collectives quantize over two or more ranks";
  const int per_node = launch.local_world_size, nodes = launch.world_size / per_node;
  std::vector<std::tuple<const char*, std::function<void(Config&)>, PeakBuffers>> layouts = {
      {"plain", [](Config&) {}, PeakBuffers::equal}};
  if (nodes >= 2) {
    layouts.emplace_back("hpz", [&](Config& c) { c.zero.hpz_partition_size = per_node; }, PeakBuffers::equal);
    layouts.emplace_back("hsdp", [&](Config& c) { c.zero.mics_shard_size = per_node; }, PeakBuffers::equal);
    layouts.emplace_back(
        "mics_hierarchical",
        [&](Config& c) {
          c.zero.mics_shard_size = launch.world_size;
          c.zero.mics_hierarchical_params_gather = true;
        },
        PeakBuffers::at_most);
  }
  for (const auto& [name, layout, peak] : layouts) {
    for (const auto& [qwz, qgz] : {std::pair{true, false}, {false, true}, {true, true}}) {
      SCOPED_TRACE(std::string(name) + (qwz ? " qwZ" : "") + (qgz ? " qgZ" : ""));
      check(
          3, /*bf16=*/true, 0,
          [&, qwz = qwz, qgz = qgz](Config& c) {
            layout(c);
            c.zero.param_persistence_threshold = 40;
            c.zero.quantized_weights = qwz;
            c.zero.quantized_gradients = qgz;
            c.zero3.qwz_block_size = 16;  // several blocks per slice
            c.zero3.qgz_block_size = 8;
          },
          peak);
    }
  }
}

TEST(MemoryPlanEngine, Stage3Schedules) {
  check(3, true, 0);
  check(3, true, 60);
}

// Every unit larger than the prefetch bucket (as a transformer layer is under "auto", 0.9 hidden^2): the first unit
// ahead is still fetched while the current one computes, and the plan's worst case counts it.
TEST(MemoryPlanEngine, UnitsLargerThanThePrefetchBucket) {
  check(3, true, 0, [](Config& c) { c.zero.prefetch_bucket_size = 20; });
  check(3, false, 60, [](Config& c) { c.zero.prefetch_bucket_size = 20; });
}

}  // namespace

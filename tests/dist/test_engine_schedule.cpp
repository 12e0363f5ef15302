// The stage-3 schedule as the engine runs it, with exact expectations: which all-gathers are issued, in
// which order, how many ahead of use, how many elements are gathered at most (the live cap, measured),
// which units persist and which are kept for reuse. The decisions depend only on the recorded order, so
// they are the same on every world size.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

// Units u0..u4 of 100 elements and "small" of 10 (persistent: threshold 20).
struct Model {
  std::vector<UnitId> big;
  UnitId small;
};

Config schedule_config(int64_t prefetch, int64_t live, int64_t reuse) {
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 2;
  c.zero.overlap_comm = true;
  c.zero.overlap_comm_set = true;
  c.zero.param_persistence_threshold = 20;
  c.zero.prefetch_bucket_size = prefetch;
  c.zero.max_live_parameters = live;
  c.zero.max_reuse_distance = reuse;
  return c;
}

Model declare(Engine& e) {
  Model m;
  for (int i = 0; i < 5; ++i) {
    m.big.push_back(e.add_unit("u" + std::to_string(i), {{"w", {10, 10}, ParamInit::normal(0.1)}}));
  }
  m.small = e.add_unit("small", {{"g", {10}, ParamInit::ones()}});
  return m;
}

// Forward u0, small, u1..u4; backward in reverse. Checks every view on the way.
void micro_step(Engine& e, const Model& m) {
  std::vector<UnitId> order = {m.big[0], m.small, m.big[1], m.big[2], m.big[3], m.big[4]};
  for (UnitId u : order) {
    auto s = e.forward_scope(u);
    ASSERT_NE(s.flat_params().data, nullptr);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto s = e.backward_scope(*it);
    TensorView g = s.flat_grads();
    for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 0.001f;
  }
}

std::vector<std::string> names(const Engine& e, const std::vector<UnitId>& ids) {
  std::vector<std::string> out;
  for (UnitId u : ids) out.push_back(e.unit(u).name);
  return out;
}

using Names = std::vector<std::string>;

}  // namespace

TEST(Schedule, FirstMicroStepGathersOnDemandThenPrefetchesAlongTheTrace) {
  auto comm = engine_world();
  Engine e(resolved_for(schedule_config(250, 300, 0), *comm), comm, cpu_device());
  Model m = declare(e);
  e.materialize();
  EXPECT_EQ(e.schedule_stats().persistent_numel, 10) << "the small unit is gathered at materialize";
  EXPECT_TRUE(e.unit(m.small).persistent);
  EXPECT_FALSE(e.unit(m.big[0]).persistent);
  const int64_t padded = e.unit(m.big[0]).padded_numel;

  // Each micro-step's statistics include its step(), which gathers the next micro-step's first units.
  e.reset_schedule_stats();
  micro_step(e, m);
  e.step();
  ScheduleStats first = e.schedule_stats();
  // No trace during the first micro-step: every entry gathers on demand and every exit releases. Its step()
  // (within the accumulation window) then gathers the next one's first units along the order just recorded:
  // u0 always, u1 within 250 elements ahead (u2 would make 300).
  EXPECT_EQ(names(e, first.gather_order),
            (Names{"u0", "u1", "u2", "u3", "u4", "u4", "u3", "u2", "u1", "u0", "u0", "u1"}));
  EXPECT_EQ(first.prefetches, 2);
  EXPECT_EQ(first.boundary_prefetches, 2);
  EXPECT_EQ(first.boundary_keeps, 0);
  EXPECT_EQ(first.peak_live_numel, 200);
  EXPECT_EQ(first.reduced_elements, 5 * padded + e.unit(m.small).padded_numel);
  ASSERT_EQ(e.recorded_order().size(), 12u);
  // What step() leaves gathered: the persistent unit and u0, u1 (within the prefetch bucket and the live cap).
  EXPECT_EQ(first.live_numel, 200);
  EXPECT_EQ(e.memory().gathered, (2 * padded + e.unit(m.small).padded_numel) * 4);

  // The window's last micro-step: u0, u1 are found gathered (hits), u2 is fetched ahead on u0's entry; the
  // optimizer step releases everything and gathers u0, u1 again from the updated slices.
  e.reset_schedule_stats();
  micro_step(e, m);
  ScheduleStats s = e.schedule_stats();
  // Along the trace, up to 250 elements ahead and 300 gathered: u2 once u0 is used; u3 once u1 is; u4 once u2
  // is; u2 again for its backward; u3 again; u1; u0. u4 is kept from its forward to its backward (distance 0 <=
  // stage3_max_reuse_distance 0).
  EXPECT_EQ(names(e, s.gather_order), (Names{"u2", "u3", "u4", "u2", "u3", "u1", "u0"}));
  EXPECT_EQ(s.prefetches, 7);
  EXPECT_EQ(s.prefetch_hits, 9);
  EXPECT_EQ(s.reuse_keeps, 1);
  EXPECT_EQ(s.boundary_keeps, 0) << "the optimizer step comes next: nothing is kept across it";
  EXPECT_EQ(s.peak_live_numel, 300) << "the live cap is reached and respected";
  EXPECT_EQ(s.persistent_numel, 10);
  e.step();
  s = e.schedule_stats();
  EXPECT_EQ(names(e, s.gather_order), (Names{"u2", "u3", "u4", "u2", "u3", "u1", "u0", "small", "u0", "u1"}));
  EXPECT_EQ(s.boundary_prefetches, 2);
  EXPECT_EQ(s.boundary_keeps, 0);
  EXPECT_EQ(s.live_numel, 200);

  // Within the next window u1 and u0, the next micro-step's first units, are kept from their backward instead
  // of released and gathered again.
  e.reset_schedule_stats();
  micro_step(e, m);
  e.step();
  s = e.schedule_stats();
  EXPECT_EQ(names(e, s.gather_order), (Names{"u2", "u3", "u4", "u2", "u3", "u1", "u0"}));
  EXPECT_EQ(s.boundary_keeps, 2);
  EXPECT_EQ(s.boundary_prefetches, 0);
  EXPECT_EQ(s.live_numel, 200);
  e.reset_schedule_stats();
  micro_step(e, m);
  s = e.schedule_stats();
  EXPECT_EQ(names(e, s.gather_order), (Names{"u2", "u3", "u4", "u2", "u3", "u1", "u0"}));
  EXPECT_EQ(s.prefetch_hits, 9) << "the kept units count as found gathered";
  e.step();
}

TEST(Schedule, ReuseKeepsUnitsAndTheCapEvictsThem) {
  auto comm = engine_world();
  // A reuse distance that covers the whole order: each unit is gathered once per micro-step.
  {
    Engine e(resolved_for(schedule_config(1000, 1000, 1'000'000), *comm), comm, cpu_device());
    Model m = declare(e);
    e.materialize();
    micro_step(e, m);
    e.reset_schedule_stats();
    e.step();
    EXPECT_EQ(names(e, e.schedule_stats().gather_order), (Names{"u0", "u1", "u2", "u3", "u4"}))
        << "the whole order fits the prefetch bucket: step() gathers every unit ahead";
    e.reset_schedule_stats();
    micro_step(e, m);
    ScheduleStats s = e.schedule_stats();
    EXPECT_EQ(s.all_gathers, 0);
    EXPECT_EQ(s.prefetch_hits, 5);
    EXPECT_EQ(s.releases, 5) << "each unit is released once, after its last use (its backward)";
    EXPECT_EQ(s.reuse_keeps, 5);
    EXPECT_EQ(s.peak_live_numel, 500);
    e.step();
  }
  // The same with a cap of 300 elements: kept units are evicted (the one used last first) to make room.
  {
    Engine e(resolved_for(schedule_config(0, 300, 1'000'000), *comm), comm, cpu_device());
    Model m = declare(e);
    e.materialize();
    micro_step(e, m);
    e.step();
    e.reset_schedule_stats();
    micro_step(e, m);
    ScheduleStats s = e.schedule_stats();
    EXPECT_LE(s.peak_live_numel, 300);
    EXPECT_GT(s.evictions, 0);
    EXPECT_EQ(s.prefetches, 0) << "prefetch bucket 0";
    // Forward keeps u0, u1, u2; u3 evicts u0 (next used last), u4 evicts u1; the backward finds u4, u3 and
    // u2 gathered and gathers u1 and u0 again.
    EXPECT_EQ(names(e, s.gather_order), (Names{"u0", "u1", "u2", "u3", "u4", "u1", "u0"}));
    MemoryStats mem = e.memory();
    EXPECT_LE(mem.peak_gathered, (300 + 10 + 5 * 3) * 4) << "gathered bytes follow the cap (plus padding)";
    e.step();
  }
}

TEST(Schedule, AfterAMicroStepThatLeftTheOrderStepGathersTheBudgetsFirstUnits) {
  auto comm = engine_world();
  Engine e(resolved_for(schedule_config(250, 300, 0), *comm), comm, cpu_device());
  Model m = declare(e);
  e.materialize();
  micro_step(e, m);
  e.step();  // the order recorded; u0 and u1 gathered ahead
  // The next micro-step leaves the order after u0: u1 and u2, gathered ahead, are never entered.
  const std::vector<UnitId> other = {m.big[0], m.big[3], m.big[4], m.big[1]};
  for (UnitId u : other) {
    auto s = e.forward_scope(u);
  }
  for (auto it = other.rbegin(); it != other.rend(); ++it) {
    auto s = e.backward_scope(*it);
  }
  e.reset_schedule_stats();
  e.step();
  // The optimizer step releases everything and gathers the new order's first units: u0 always, u3 within 250
  // elements ahead (u4 would make 300), whatever was gathered ahead and left unused.
  ScheduleStats s = e.schedule_stats();
  EXPECT_EQ(names(e, s.gather_order), (Names{"small", "u0", "u3"}));
  EXPECT_EQ(s.boundary_prefetches, 2);
  EXPECT_EQ(s.live_numel, 200);
}

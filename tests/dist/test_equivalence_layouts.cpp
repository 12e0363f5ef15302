// The layouts for slow links between nodes train the equivalence model (support/reference_model.hpp) like plain
// ZeRO-3: HSDP (MiCS with a shard group of one node), MiCS over every node with the hierarchical gather, and ZeRO++
// hpZ with a secondary partition per node, on nodes simulated by `zero3 launch --simulate-nodes` (2 x 2 and 3 x 2
// ranks) and on one node of 4 (groups within it). fp32 at the equivalence tolerance (1e-5: only the order of the
// reductions differs); bf16 reduced in fp32 within the bf16 bound of test_equivalence.cpp (5e-3), and reduced in
// bf16 (DeepSpeed's default) within that of bf16 reductions (3e-2). Then the traffic: the engine's counters equal
// plan_traffic() step for step, HSDP sends nothing across nodes between accumulation boundaries, and hpZ's gathers
// after the first of each unit stay inside the group.
// zero3-test-ranks: 4
// zero3-test-nodes: 2x2 3x2
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/equivalence_check.hpp"
#include "support/layouts.hpp"
#include "support/planned_traffic.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"
#include "zero3/traffic_plan.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct LayoutVariant {
  std::string name;
  // Sets the layout; false when the world cannot hold it (the test is then skipped).
  LayoutSetter layout;
  std::function<void(Config&)> change;
  double tolerance;
};

void PrintTo(const LayoutVariant& v, std::ostream* os) { *os << v.name; }

void bf16_fp32_sums(Config& c) {
  c.bf16.enabled = true;
  c.communication_data_type = DType::f32;
}

void bf16(Config& c) { c.bf16.enabled = true; }

const LayoutVariant kVariants[] = {
    {"hsdp", hsdp_layout, nullptr, 1e-5},
    {"hsdp_tight_schedule", hsdp_layout, tight_schedule, 1e-5},
    {"hsdp_accum3", hsdp_layout, [](Config& c) { c.gradient_accumulation_steps = 3; }, 1e-5},
    {"hsdp_no_overlap", hsdp_layout, [](Config& c) { c.zero.overlap_comm = false, c.zero.overlap_comm_set = true; },
     1e-5},
    {"hsdp_bf16", hsdp_layout, bf16_fp32_sums, 5e-3},
    {"hsdp_bf16_reduced_in_bf16", hsdp_layout, bf16, 3e-2},
    {"mics_hierarchical", mics_hierarchical_layout, nullptr, 1e-5},
    {"mics_hierarchical_tight_schedule", mics_hierarchical_layout, tight_schedule, 1e-5},
    {"mics_hierarchical_bf16", mics_hierarchical_layout, bf16_fp32_sums, 5e-3},
    {"hpz", hpz_layout, nullptr, 1e-5},
    {"hpz_tight_schedule", hpz_layout, tight_schedule, 1e-5},
    {"hpz_accum3_tight", hpz_layout,
     [](Config& c) {
       tight_schedule(c);
       c.gradient_accumulation_steps = 3;
     },
     1e-5},
    {"hpz_bf16", hpz_layout,
     [](Config& c) {
       tight_schedule(c);
       bf16_fp32_sums(c);
     },
     5e-3},
    {"hpz_bf16_reduced_in_bf16", hpz_layout,
     [](Config& c) {
       tight_schedule(c);
       bf16(c);
     },
     3e-2},
};

class Layouts : public ::testing::TestWithParam<LayoutVariant> {};

TEST_P(Layouts, SameLossesAndWeightsAsTheReference) {
  const LayoutVariant& v = GetParam();
  Config probe;
  if (!v.layout(probe)) GTEST_SKIP() << v.name << " needs two or more nodes";
  expect_equal_to_reference(Variant{v.name, 3,
                                    [&](Config& c) {
                                      v.layout(c);
                                      if (v.change) v.change(c);
                                    },
                                    v.tolerance});
}

INSTANTIATE_TEST_SUITE_P(Engine, Layouts, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<LayoutVariant>& info) { return info.param.name; });

// ---- Traffic ----

// Trains one optimizer step (its micro-steps), calling `after` with the micro-step's index and the traffic it
// caused.
struct MicroTraffic {
  CollectiveTraffic gathers, reductions;
};
void train_step(Engine& engine, const MlpUnits& units, const TrainPlan& plan, int64_t step,
                const std::function<void(int64_t, const MicroTraffic&)>& after = nullptr) {
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t micro = 0; micro < gas; ++micro) {
    const ScheduleStats before = engine.schedule_stats();
    Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, engine.rank(), engine.world_size()),
                         plan.micro_batch);
    mlp_micro_step(engine, units, plan.dims, b);
    engine.step();
    const ScheduleStats now = engine.schedule_stats();
    if (after) after(micro, {now.gather_traffic - before.gather_traffic, now.reduce_traffic - before.reduce_traffic});
  }
}

TEST(LayoutTraffic, TheEngineCountsWhatThePlanPredicts) {
  auto comm = engine_world();
  const LauncherNodes n = launcher_nodes();
  TrainPlan plan;
  plan.world = comm->size();
  const std::vector<std::pair<std::string, LayoutSetter>> layouts = {{"plain", plain_layout},
                                                                     {"hsdp", hsdp_layout},
                                                                     {"mics_hierarchical", mics_hierarchical_layout},
                                                                     {"hpz", hpz_layout}};
  for (const auto& [name, layout] : layouts) {
    for (bool tight : {false, true}) {
      Config c = equivalence_config(3);
      c.gradient_accumulation_steps = 3;
      c.bf16.enabled = true;
      if (tight) tight_schedule(c);
      if (!layout(c)) continue;
      SCOPED_TRACE(name + (tight ? " (tight schedule)" : ""));
      Engine engine(resolved_for(c, *comm), comm, cpu_device());
      MlpUnits units = declare_mlp(engine, plan.dims);
      engine.materialize();
      train_step(engine, units, plan, 0);  // the first step records the order; the steady state follows
      engine.reset_schedule_stats();
      train_step(engine, units, plan, 1);
      train_step(engine, units, plan, 2);
      const ScheduleStats got = engine.schedule_stats();
      expect_planned_traffic(got, c, *comm, n.per_node, plan.dims, /*steps=*/2);
      EXPECT_GT(got.gather_traffic.collectives, 0);
    }
  }
}

TEST(LayoutTraffic, HsdpSendsNothingAcrossNodesBetweenBoundaries) {
  const LauncherNodes n = launcher_nodes();
  if (n.count < 2) GTEST_SKIP() << "needs two or more nodes";
  auto comm = engine_world();
  TrainPlan plan;
  plan.world = comm->size();
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 4;
  hsdp_layout(c);
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  train_step(engine, units, plan, 0);
  for (int64_t step = 1; step < 3; ++step) {
    train_step(engine, units, plan, step, [&](int64_t micro, const MicroTraffic& t) {
      SCOPED_TRACE("step " + std::to_string(step) + ", micro-step " + std::to_string(micro));
      EXPECT_GT(t.gathers.collectives + t.reductions.collectives, 0);
      EXPECT_GT(t.reductions.intra_node_bytes, 0) << "the reduce-scatter within the node";
      EXPECT_EQ(t.gathers.inter_node_collectives, 0);
      EXPECT_EQ(t.gathers.inter_node_bytes, 0);
      if (micro + 1 < engine.gradient_accumulation_steps()) {
        EXPECT_EQ(t.reductions.inter_node_collectives, 0);
        EXPECT_EQ(t.reductions.inter_node_bytes, 0);
      } else {
        // The boundary: the all-reduce across the replicas, one rank per node, every rank sending across.
        EXPECT_GT(t.reductions.inter_node_collectives, 0);
        EXPECT_GT(t.reductions.inter_node_bytes, 0);
      }
    });
  }
}

TEST(LayoutTraffic, HpzGathersAfterTheFirstStayInTheGroup) {
  const LauncherNodes n = launcher_nodes();
  if (n.count < 2) GTEST_SKIP() << "needs two or more nodes";
  auto comm = engine_world();
  TrainPlan plan;
  plan.world = comm->size();
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 3;
  tight_schedule(c);  // nothing persistent, every backward gathers again
  hpz_layout(c);
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  train_step(engine, units, plan, 0);
  const int64_t unit_count = static_cast<int64_t>(engine.num_units());
  // The next micro-step's first units: after the optimizer step, step() gathers them over every rank.
  const int64_t first = static_cast<int64_t>(next_micro_step_first_units(engine).size());
  ASSERT_GT(first, 0);
  for (int64_t step = 1; step < 3; ++step) {
    train_step(engine, units, plan, step, [&](int64_t micro, const MicroTraffic& t) {
      SCOPED_TRACE("step " + std::to_string(step) + ", micro-step " + std::to_string(micro));
      if (micro == 0) {
        // Forward: each unit's first gather after the optimizer step, over every rank (but the first units', issued
        // by the previous step()); backward: from the secondary partition, within the node.
        EXPECT_EQ(t.gathers.inter_node_collectives, unit_count - first);
        EXPECT_GT(t.gathers.collectives, unit_count - first) << "backward gathered too";
      } else if (micro + 1 < engine.gradient_accumulation_steps()) {
        EXPECT_EQ(t.gathers.inter_node_collectives, 0);
        EXPECT_EQ(t.gathers.inter_node_bytes, 0);
        EXPECT_GE(t.gathers.collectives, unit_count - first);
      } else {
        // The boundary: step() gathers the next micro-step's first units from the updated primary partition.
        EXPECT_EQ(t.gathers.inter_node_collectives, first);
        EXPECT_GE(t.gathers.collectives, unit_count);
      }
    });
  }
}

// ---- MiCS's all-reduce across the replicas in the last backward ----

// Trains `steps` optimizer steps of the equivalence MLP, counting the reductions across nodes (MiCS's all-reduce
// across the replicas) launched during the micro-steps' backward and during step().
struct OverlapRun {
  std::vector<double> losses;
  std::vector<StepResult> steps;
  std::vector<float> state;  // this rank's master slices and Adam moments
  std::map<std::string, std::vector<float>> params;
  int64_t across_in_backward = 0, across_in_step = 0;
};
OverlapRun train_counting_replica_reductions(Config c, const std::shared_ptr<Communicator>& comm, int64_t steps) {
  TrainPlan plan;
  plan.world = comm->size();
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  OverlapRun r;
  const int64_t gas = engine.gradient_accumulation_steps();
  auto across = [&] { return engine.schedule_stats().reduce_traffic.inter_node_collectives; };
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < gas; ++micro) {
      const int64_t start = across();
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, engine.rank(), engine.world_size()),
                           plan.micro_batch);
      r.losses.push_back(mlp_micro_step(engine, units, plan.dims, b));
      const int64_t before_step = across();
      r.steps.push_back(engine.step());
      r.across_in_backward += before_step - start;
      r.across_in_step += across() - before_step;
    }
  }
  r.state = local_optimizer_state(engine);
  r.params = gather_params(engine);
  return r;
}

// With overlap_comm, the all-reduce across the replicas starts in the window's last backward: the units go to its
// buckets as their scopes close for the last time by the recorded schedule, and a full bucket starts at once; without
// it step() starts the same buckets in the same order. Both train bit for bit alike (losses, gradient norms, every
// rank's master slices and Adam moments, the full weights), at fp32 and with bf16 reductions, on 2 and 3 replicas
// (where the order of the sums would show).
TEST(LayoutOverlap, HsdpReplicaAllReduceStartsInTheLastBackwardBitForBit) {
  const LauncherNodes n = launcher_nodes();
  if (n.count < 2) GTEST_SKIP() << "needs two or more nodes";
  auto comm = engine_world();
  for (bool bf16_reductions : {false, true}) {
    SCOPED_TRACE(bf16_reductions ? "bf16, reduced in bf16" : "fp32");
    auto config = [&](bool overlap) {
      Config c = equivalence_config(3);
      c.gradient_accumulation_steps = 3;
      if (bf16_reductions) bf16(c);
      hsdp_layout(c);
      c.zero.overlap_comm = overlap;
      c.zero.overlap_comm_set = true;
      return c;
    };
    const OverlapRun on = train_counting_replica_reductions(config(true), comm, 4);
    const OverlapRun off = train_counting_replica_reductions(config(false), comm, 4);
    // Every window's last micro-step follows the one before it: its first buckets start in backward, the rest (the
    // last units' and the partly filled one) in step().
    EXPECT_GT(on.across_in_backward, 0);
    EXPECT_GT(on.across_in_step, 0);
    EXPECT_EQ(off.across_in_backward, 0);
    EXPECT_EQ(off.across_in_step, on.across_in_backward + on.across_in_step);
    ASSERT_EQ(on.losses.size(), off.losses.size());
    for (size_t i = 0; i < on.losses.size(); ++i) EXPECT_EQ(on.losses[i], off.losses[i]) << "micro-step " << i;
    ASSERT_EQ(on.steps.size(), off.steps.size());
    for (size_t i = 0; i < on.steps.size(); ++i) {
      EXPECT_EQ(on.steps[i].grad_norm, off.steps[i].grad_norm) << "micro-step " << i;
    }
    ASSERT_EQ(on.state.size(), off.state.size());
    size_t differ = 0;
    for (size_t i = 0; i < on.state.size(); ++i) differ += on.state[i] != off.state[i] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << "of " << on.state.size() << " master and Adam values on rank " << comm->rank();
    EXPECT_EQ(on.params, off.params);
  }
}

// A unit whose backward scope opens again in the window's last micro-step, after the recorded schedule said its
// gradients were final: with overlap_comm it is in the all-reduce across the replicas already, so the scope is
// refused with the unit's name; without overlap_comm the unit waits for step() and the step applies.
TEST(LayoutOverlap, AUnitReopenedAfterItsReplicaAllReduceStartedIsRefused) {
  const LauncherNodes n = launcher_nodes();
  if (n.count < 2) GTEST_SKIP() << "needs two or more nodes";
  auto comm = engine_world();
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap_comm" : "no overlap_comm");
    Config c = equivalence_config(3);
    hsdp_layout(c);
    c.zero.overlap_comm = overlap;
    c.zero.overlap_comm_set = true;
    TrainPlan plan;
    plan.world = comm->size();
    Engine engine(resolved_for(c, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    const int64_t gas = engine.gradient_accumulation_steps();
    int64_t start = 0;
    for (int64_t micro = 0; micro < gas; ++micro) {
      start = engine.schedule_stats().reduce_traffic.inter_node_collectives;
      mlp_micro_step(engine, units, plan.dims,
                     make_batch(plan.dims, plan.data_seed, batch_index(0, micro, gas, engine.rank(), engine.world_size()),
                                plan.micro_batch));
      if (micro + 1 < gas) engine.step();
    }
    const int64_t in_backward = engine.schedule_stats().reduce_traffic.inter_node_collectives - start;
    const std::string head = engine.unit(units.head).name;  // the first scope backward closes
    if (overlap) {
      EXPECT_GT(in_backward, 0);
      try {
        auto scope = engine.backward_scope(units.head);
        ADD_FAILURE() << "the scope of '" << head << "' opened again";
      } catch (const InvalidArgument& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("backward_scope('" + head + "')"), std::string::npos) << message;
        EXPECT_NE(message.find("overlap_comm"), std::string::npos) << message;
      }
    } else {
      EXPECT_EQ(in_backward, 0);
      { auto scope = engine.backward_scope(units.head); }
      const StepResult r = engine.step();
      EXPECT_TRUE(r.boundary);
      EXPECT_TRUE(r.applied);
    }
  }
}

}  // namespace

// The next micro-step's first units gathered across the micro-step boundary (docs/gpu.md, "Prefetch across the
// micro-step boundary") never hand out stale or foreign values: after step() left them gathered, parameters changed
// outside step() (local_shard() + refresh_params(), load_checkpoint) reach the next forward; an evaluation in
// another order reads the current values and leaves training as it would have been without it; and an engine
// destroyed right after step(), its gathers still in flight, leaves the ranks' communicator usable. The checkpoint is
// saved right after a step() whose gathers may still be queued on the communication thread (overlap_comm): its own
// collectives on the engine's communicator must come after them on every rank (Engine::communicator()).
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/boundary_prefetch.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

constexpr int kUnits = 5;

// fp32, gradient_accumulation_steps 2, units of 100 elements (none persistent), two of them within the prefetch
// bucket: step() leaves u0 and u1 gathered.
Config boundary_config() {
  Config c = equivalence_config(3);
  c.zero.overlap_comm = true;
  c.zero.overlap_comm_set = true;
  c.zero.prefetch_bucket_size = 250;
  c.zero.max_reuse_distance = 0;
  c.steps_per_print = 0;
  return c;
}

std::vector<UnitId> declare(Engine& e) {
  std::vector<UnitId> units;
  for (int i = 0; i < kUnits; ++i) {
    units.push_back(e.add_unit("u" + std::to_string(i), {{"w", {10, 10}, ParamInit::normal(0.1)}}));
  }
  return units;
}

// Forward u0..u4, backward in reverse, with gradients that depend on the rank, the micro-step and the weights.
void micro_step(Engine& e, const std::vector<UnitId>& units, int64_t micro) {
  for (UnitId u : units) {
    auto s = e.forward_scope(u);
  }
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    auto s = e.backward_scope(*it);
    const float* w = s.flat_params().as<float>();
    float* g = s.flat_grads().as<float>();
    for (int64_t i = 0; i < s.flat_grads().numel; ++i) {
      g[i] = w[i] * 0.5f + 0.01f * static_cast<float>((i + micro * 3 + e.rank()) % 7 - 3);
    }
  }
}

std::vector<float> master(Engine& e, UnitId u) {
  std::vector<float> out(static_cast<size_t>(e.unit(u).numel));
  e.gather_master_params(u, out.data());
  return out;
}

// What a forward scope of `u` hands out.
std::vector<float> forward_values(Engine& e, UnitId u) {
  auto s = e.forward_scope(u);
  const TensorView v = s.flat_params();
  return std::vector<float>(v.as<float>(), v.as<float>() + v.numel);
}

// Forward and backward of every unit with each scope's values compared to the master weights (gathered first: a
// collective, so every rank does it at the same point).
void expect_scopes_read(Engine& e, const std::vector<UnitId>& units, int64_t micro) {
  std::vector<std::vector<float>> want;
  for (UnitId u : units) want.push_back(master(e, u));
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(forward_values(e, units[i]), want[i]) << "forward of " << e.unit(units[i]).name;
  }
  for (size_t i = units.size(); i-- > 0;) {
    auto s = e.backward_scope(units[i]);
    const TensorView v = s.flat_params();
    EXPECT_EQ(std::vector<float>(v.as<float>(), v.as<float>() + v.numel), want[i])
        << "backward of " << e.unit(units[i]).name;
    float* g = s.flat_grads().as<float>();
    for (int64_t j = 0; j < s.flat_grads().numel; ++j) g[j] = 0.001f * static_cast<float>((j + micro) % 5);
  }
}

}  // namespace

TEST(BoundaryPrefetch, RefreshParamsDropsTheGatheredFirstUnits) {
  auto comm = engine_world();
  Engine e(resolved_for(boundary_config(), *comm), comm, cpu_device());
  std::vector<UnitId> units = declare(e);
  e.materialize();
  micro_step(e, units, 0);
  e.step();  // within the window: u0 and u1 are gathered ahead
  ASSERT_EQ(next_micro_step_first_units(e).size(), 2u);
  ASSERT_EQ(e.schedule_stats().live_numel, 200);
  const std::vector<float> before = master(e, units[0]);

  // Every master slice moves: the next forward must see the moved values, not the gathered copies.
  for (UnitId u : units) {
    ShardView v = e.local_shard(u);
    for (int64_t i = 0; i < v.length; ++i) v.master[i] += 0.25f;
  }
  const int64_t boundary_before = e.schedule_stats().boundary_prefetches;
  e.refresh_params();
  EXPECT_EQ(e.schedule_stats().boundary_prefetches, boundary_before + 2) << "gathered again from the new values";
  const std::vector<float> after = master(e, units[0]);
  ASSERT_NE(after, before);
  EXPECT_EQ(after[0], before[0] + 0.25f);
  expect_scopes_read(e, units, 1);
  e.step();
}

TEST(BoundaryPrefetch, LoadCheckpointReachesTheNextForward) {
  auto comm = engine_world();
  SharedTempDir dir(*comm, "zero3-boundary-prefetch");
  Engine e(resolved_for(boundary_config(), *comm), comm, cpu_device());
  std::vector<UnitId> units = declare(e);
  e.materialize();
  for (int64_t m = 0; m < 2; ++m) {
    micro_step(e, units, m);
    e.step();
  }
  save_checkpoint(e, dir.path(), "one");
  std::vector<std::vector<float>> saved;
  for (UnitId u : units) saved.push_back(master(e, u));
  for (int64_t m = 2; m < 4; ++m) {
    micro_step(e, units, m);
    e.step();  // the last one an optimizer step: u0 and u1 gathered from the new weights
  }
  ASSERT_EQ(e.schedule_stats().live_numel, 200);
  ASSERT_NE(master(e, units[0]), saved[0]);

  load_checkpoint(e, dir.path(), "one");
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(forward_values(e, units[i]), saved[i]) << "forward of " << e.unit(units[i]).name << " after the load";
  }
  for (size_t i = units.size(); i-- > 0;) {
    auto s = e.backward_scope(units[i]);
  }
  e.step();
}

// Evaluation enters other units in another order: it reads the current values, and training afterwards finds its
// first units gathered again and trains bit for bit as without the evaluation.
TEST(BoundaryPrefetch, EvaluationInAnotherOrderAfterStep) {
  auto comm = engine_world();
  auto run = [&](bool evaluate) {
    Engine e(resolved_for(boundary_config(), *comm), comm, cpu_device());
    std::vector<UnitId> units = declare(e);
    e.materialize();
    for (int64_t m = 0; m < 4; ++m) {
      micro_step(e, units, m);
      e.step();
      if (m != 1 && m != 2) continue;  // after an optimizer step, then within the window
      if (evaluate) {
        std::vector<std::vector<float>> want;
        for (UnitId u : units) want.push_back(master(e, u));
        const ScheduleStats before = e.schedule_stats();
        {
          EvalMode eval = e.evaluate();
          EXPECT_EQ(e.schedule_stats().live_numel, 0) << "evaluation starts with training's first units released";
          for (int batch = 0; batch < 2; ++batch) {
            for (size_t i : {size_t{4}, size_t{2}, size_t{3}}) {
              EXPECT_EQ(forward_values(e, units[i]), want[i]) << "evaluated " << e.unit(units[i]).name;
            }
            eval.next_batch();
          }
          eval.end();
        }
        // Training's first units are gathered again for its next micro-step.
        EXPECT_EQ(e.schedule_stats().boundary_prefetches, before.boundary_prefetches + 2);
        EXPECT_EQ(e.schedule_stats().live_numel, 200);
      }
      // A window of micro-steps that check every scope's values (in both runs).
      for (int64_t k = 0; k < 2; ++k) {
        expect_scopes_read(e, units, 10 * m + k);
        e.step();
      }
    }
    return gather_params(e);
  };
  const auto plain = run(false);
  const auto evaluated = run(true);
  EXPECT_EQ(first_bit_difference(evaluated, plain), "");
}

// Destroyed right after step() with the next micro-step's gathers in flight (an asynchronous queue): every rank
// waits for its own gathers, which every rank issued, so the next engine on the same communicator trains.
TEST(BoundaryPrefetch, EngineDestroyedRightAfterStep) {
  auto comm = engine_world();
  for (int64_t micro_steps : {1, 2}) {  // within the window, and after an optimizer step
    Engine e(resolved_for(boundary_config(), *comm), comm, cpu_device());
    std::vector<UnitId> units = declare(e);
    e.materialize();
    for (int64_t m = 0; m < micro_steps; ++m) {
      micro_step(e, units, m);
      e.step();
    }
    EXPECT_EQ(e.schedule_stats().live_numel, 200);
  }
  Engine next(resolved_for(boundary_config(), *comm), comm, cpu_device());
  std::vector<UnitId> units = declare(next);
  next.materialize();
  micro_step(next, units, 0);
  next.step();
  expect_scopes_read(next, units, 1);
  next.step();
}

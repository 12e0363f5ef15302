// Ranks that disagree fail with a sentence on every rank instead of hanging, aborting or training wrong
// weights: a different order of unit scopes in the first micro-step (or in any micro-step with
// zero3.check_schedule_every_step), a rank that calls step() early, different model declarations, and, with the
// default settings, a different order in any later micro-step: a reversed forward (different unit sizes, so
// different all-gathers: Gloo used to abort the process), a reordered backward (same sizes: the reduced gradients
// used to land in the wrong units and the optimizer applied them), an evaluation batch in another order. After
// such an error the engine refuses every further call with the same error.
// zero3-test-ranks: 2 3
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string others(int world) {
  std::string s = world == 2 ? "rank 1" : "ranks 1";
  for (int r = 2; r < world; ++r) s += ", " + std::to_string(r);
  return s;
}

// Every rank but the last, as the messages list them.
std::string all_but_last(int world) {
  std::string s = world == 2 ? "rank 0" : "ranks 0";
  for (int r = 1; r < world - 1; ++r) s += ", " + std::to_string(r);
  return s;
}

Config later_config(int stage, bool overlap) {
  Config c = equivalence_config(stage);
  c.gradient_accumulation_steps = 1;
  c.zero.overlap_comm_set = true;
  c.zero.overlap_comm = overlap;
  return c;
}

std::string stage_and_overlap(const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
  return "stage" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_overlap" : "_inline");
}

class Divergence : public ::testing::TestWithParam<int> {};

TEST_P(Divergence, DifferentFirstOrderFailsOnEveryRankNamingTheUnits) {
  auto comm = engine_world();
  Engine e(resolved_for(equivalence_config(GetParam()), *comm), comm, cpu_device());
  UnitId a = e.add_unit("alpha", {{"w", {5, 3}, ParamInit::ones()}});
  UnitId b = e.add_unit("beta", {{"w", {4, 9}, ParamInit::ones()}});
  e.materialize();
  const bool first = comm->rank() == 0;
  std::string message;
  try {
    auto s1 = e.forward_scope(first ? a : b);
    auto s2 = e.forward_scope(first ? b : a);
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    message = err.what();
  }
  EXPECT_TRUE(contains(message, "different orders")) << message;
  EXPECT_TRUE(contains(message, "scope event 0 of micro-step 0")) << message;
  EXPECT_TRUE(contains(message, "rank 0 called forward_scope('alpha')")) << message;
  EXPECT_TRUE(contains(message, others(comm->size()) + " called forward_scope('beta')")) << message;
  // The engine stays failed.
  try {
    e.step();
    ADD_FAILURE() << "step() after a divergence should throw";
  } catch (const CommError& err) {
    EXPECT_EQ(std::string(err.what()), message);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Divergence, ::testing::Values(1, 3));

TEST(Divergence, EveryStepCheckCatchesALaterDifferenceAndAnEarlyStep) {
  auto comm = engine_world();
  Config c = equivalence_config(3);
  c.zero3.check_schedule_every_step = true;
  c.gradient_accumulation_steps = 1;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  for (int step = 0; step < 3; ++step) {
    mlp_micro_step(e, units, d, make_batch(d, 1, step * comm->size() + comm->rank(), 2));
    EXPECT_TRUE(e.step().applied);
  }
  // Micro-step 3: the last rank skips the backward scope of fc1 and calls step() at once (events: open fc1,
  // close fc1, then backward_scope('fc1') against step()).
  std::string message;
  try {
    const bool skipper = comm->rank() == comm->size() - 1;
    { auto s = e.forward_scope(units.fc1); }
    if (!skipper) {
      auto s = e.backward_scope(units.fc1);
    }
    e.step();
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    message = err.what();
  }
  const int last = comm->size() - 1;
  EXPECT_TRUE(contains(message, "scope event 2 of micro-step 3")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(last) + " called step()")) << message;
  EXPECT_TRUE(contains(message, "called backward_scope('fc1')")) << message;
}

TEST(Divergence, DifferentDeclarationsFailAtMaterialize) {
  auto comm = engine_world();
  Engine e(resolved_for(equivalence_config(2), *comm), comm, cpu_device());
  e.add_unit("same", {{"w", {3}}});
  e.add_unit("layer", {{"w", {comm->rank() == 1 ? 6 : 5, 2}}});
  try {
    e.materialize();
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    std::string m = err.what();
    EXPECT_TRUE(contains(m, "declared different models")) << m;
    EXPECT_TRUE(contains(m, "Unit #1")) << m;
    EXPECT_TRUE(contains(m, "'layer'")) << m;
  }
}

// The first report: three micro-steps as usual, then in micro-step 3 the last rank runs its forward scopes in
// reverse. At stage 3 the ranks then all-gather units of different sizes (Gloo aborted the process on it); at
// the other stages nothing is gathered and the difference surfaces at step(). Either way: a CommError on every
// rank naming the micro-step, the first differing scope event and the ranks.
class LaterDivergence : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(LaterDivergence, ReversedForwardInALaterMicroStepFailsOnEveryRank) {
  const auto [stage, overlap] = GetParam();
  auto comm = engine_world();
  const int world = comm->size(), last = world - 1;
  Engine e(resolved_for(later_config(stage, overlap), *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  for (int step = 0; step < 3; ++step) {
    mlp_micro_step(e, units, d, make_batch(d, 1, step * world + comm->rank(), 2));
    EXPECT_TRUE(e.step().applied);
  }
  std::vector<UnitId> order = {units.fc1, units.norm, units.fc2, units.head};
  if (comm->rank() == last) std::reverse(order.begin(), order.end());
  std::string message;
  try {
    for (UnitId u : order) {
      auto s = e.forward_scope(u);
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      auto s = e.backward_scope(*it);
    }
    e.step();
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    message = err.what();
  }
  EXPECT_TRUE(contains(message, "different orders at scope event 0 of micro-step 3 (optimizer step 3)")) << message;
  EXPECT_TRUE(contains(message, all_but_last(world) + " called forward_scope('fc1')")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(last) + " called forward_scope('head')")) << message;
  if (stage == 3) {
    // Found at the first all-gather, by the communicator, before any data moved.
    EXPECT_TRUE(contains(message, "Found when the ranks' collectives differed")) << message;
    EXPECT_TRUE(contains(message, "all_gather of unit")) << message;
  }
  try {
    e.step();
    ADD_FAILURE() << "step() after a divergence should throw";
  } catch (const CommError& err) {
    EXPECT_EQ(std::string(err.what()), message);
  }
}

// The second report: the last rank closes its backward scopes in another order in micro-step 2. The units have
// the same size, so every collective matches and the reduce-scatters add the gradients into the wrong units;
// the optimizer then applied them (11.8% off after 20 steps). Now step() compares the micro-step's scope events
// before it reduces the last bucket or applies anything: an error, and this rank's weights and Adam state are
// exactly those of the last good step.
TEST_P(LaterDivergence, ReorderedBackwardFailsBeforeTheOptimizerApplies) {
  const auto [stage, overlap] = GetParam();
  auto comm = engine_world();
  const int world = comm->size(), last = world - 1;
  Config c = later_config(stage, overlap);
  c.zero.param_persistence_threshold = 0;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  std::vector<UnitId> layers;
  for (int l = 0; l < 3; ++l) {
    layers.push_back(e.add_unit("layer" + std::to_string(l), {{"w", {6, 5}, ParamInit::normal(0.1)}}));
  }
  e.materialize();
  auto micro_step = [&](int step, bool reorder) {
    for (UnitId u : layers) {
      auto s = e.forward_scope(u);
    }
    std::vector<UnitId> backward(layers.rbegin(), layers.rend());
    if (reorder) std::reverse(backward.begin(), backward.end());
    for (UnitId u : backward) {
      auto s = e.backward_scope(u);
      TensorView g = s.grad("w");
      for (int64_t i = 0; i < g.numel; ++i) {
        g.as<float>()[i] = 0.01f * static_cast<float>((u.index + 1) * (comm->rank() + 2) * (step + 1)) +
                           0.001f * static_cast<float>(i % 7);
      }
    }
    return e.step();
  };
  for (int step = 0; step < 2; ++step) EXPECT_TRUE(micro_step(step, false).applied);
  const std::vector<float> before = local_optimizer_state(e);
  const TrainingState counters = e.training_state();
  std::string message;
  try {
    micro_step(2, comm->rank() == last);
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    message = err.what();
  }
  // Events: three forward scopes (6 events), then the backward scopes: event 6 differs.
  EXPECT_TRUE(contains(message, "different orders at scope event 6 of micro-step 2 (optimizer step 2)")) << message;
  EXPECT_TRUE(contains(message, all_but_last(world) + " called backward_scope('layer2')")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(last) + " called backward_scope('layer0')")) << message;
  EXPECT_EQ(local_optimizer_state(e), before) << "the optimizer applied gradients reduced in different orders";
  EXPECT_EQ(e.training_state().applied_steps, counters.applied_steps);
  EXPECT_THROW(e.step(), CommError);
}

INSTANTIATE_TEST_SUITE_P(Stages, LaterDivergence, ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Bool()),
                         stage_and_overlap);

// Evaluation batches after the first are compared the same way: at stage 3 by the first all-gather that differs,
// at stage 1 when EvalMode::next_batch() ends the batch.
class EvalDivergence : public ::testing::TestWithParam<int> {};

TEST_P(EvalDivergence, ABatchInAnotherOrderFailsOnEveryRank) {
  auto comm = engine_world();
  const int world = comm->size(), last = world - 1;
  Config c = later_config(GetParam(), true);
  c.zero.param_persistence_threshold = 0;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  mlp_micro_step(e, units, d, make_batch(d, 1, comm->rank(), 2));
  e.step();
  std::string message;
  try {
    EvalMode eval = e.evaluate();
    mlp_eval_loss(e, units, d, make_batch(d, 2, comm->rank(), 2));
    eval.next_batch();
    std::vector<UnitId> order = {units.fc1, units.norm, units.fc2, units.head};
    if (comm->rank() == last) std::swap(order[0], order[3]);
    for (UnitId u : order) {
      auto s = e.forward_scope(u);
    }
    eval.next_batch();
    eval.end();
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const CommError& err) {
    message = err.what();
  }
  EXPECT_TRUE(contains(message, "different orders at scope event 0 of evaluation batch 1")) << message;
  EXPECT_TRUE(contains(message, all_but_last(world) + " called forward_scope('fc1')")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(last) + " called forward_scope('head')")) << message;
  EXPECT_THROW(e.step(), CommError);
}

INSTANTIATE_TEST_SUITE_P(Stages, EvalDivergence, ::testing::Values(1, 3));

}  // namespace

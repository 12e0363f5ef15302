// Ranks that disagree fail with a sentence on every rank instead of hanging: a different order of unit
// scopes in the first micro-step (or in any micro-step with zero3.check_schedule_every_step), a rank
// that calls step() early, and different model declarations. After such an error the engine refuses
// every further call with the same error.
// zero3-test-ranks: 2 3
#include <gtest/gtest.h>

#include <string>

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
  EXPECT_TRUE(contains(message, "entry 0")) << message;
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
  // Micro-step 3: the last rank skips the backward scope of fc1 and calls step() at once.
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
  EXPECT_TRUE(contains(message, "entry 1 of micro-step 3")) << message;
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

}  // namespace

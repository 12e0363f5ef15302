// step() at an accumulation boundary with no backward scope since the previous one applies nothing, as PyTorch's
// optimizers skip parameters without gradients: no update, no weight decay, no Adam step, the lr schedule does
// not move, and the step counts as skipped (global_steps = applied + skipped). It used to apply weight decay and
// advance Adam's step count. Every rank decides alike: the ranks' scopes were compared at every step().
// The check: a run with such an empty window (one micro-step with forward scopes only, one with no scope at all)
// leaves the state bit for bit as it was, and ends with the weights of the same run without the window.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Result {
  std::map<std::string, std::vector<float>> params;
  TrainingState state;
};

// Four optimizer steps of two micro-steps each; with `empty_window`, a window without backward comes after the
// second (and is checked here).
Result train(int stage, bool empty_window) {
  auto comm = engine_world();
  Config c = equivalence_config(stage);  // AdamW with weight decay, WarmupLR, 2 micro-steps per step
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  int64_t batch = 0;
  auto optimizer_step = [&] {
    StepResult r;
    for (int k = 0; k < 2; ++k) {
      mlp_micro_step(e, units, d, make_batch(d, 5, batch++ * comm->size() + comm->rank(), 3));
      r = e.step();
    }
    EXPECT_TRUE(r.applied);
  };
  optimizer_step();
  optimizer_step();
  if (empty_window) {
    const std::vector<float> before = local_optimizer_state(e);
    const TrainingState counters = e.training_state();
    const double lr = e.current_lr();
    mlp_eval_loss(e, units, d, make_batch(d, 6, comm->rank(), 3));  // forward scopes only
    StepResult first = e.step();
    EXPECT_FALSE(first.boundary);
    StepResult r = e.step();  // no scope at all
    EXPECT_TRUE(r.boundary);
    EXPECT_FALSE(r.applied);
    EXPECT_FALSE(r.overflow);
    EXPECT_EQ(r.global_step, counters.global_steps + 1);
    EXPECT_EQ(r.lr, static_cast<double>(static_cast<float>(lr)));  // the lr the next applied step uses, as a float
    EXPECT_EQ(local_optimizer_state(e), before)
        << "an optimizer step without gradients changed the weights or Adam's state";
    const TrainingState after = e.training_state();
    EXPECT_EQ(after.applied_steps, counters.applied_steps) << "Adam's step count advanced";
    EXPECT_EQ(after.skipped_steps, counters.skipped_steps + 1);
    EXPECT_EQ(after.global_steps, counters.global_steps + 1);
    EXPECT_EQ(after.micro_steps, counters.micro_steps + 2);
    EXPECT_EQ(e.current_lr(), lr) << "the lr schedule moved";
  }
  optimizer_step();
  optimizer_step();
  return {gather_params(e), e.training_state()};
}

class NoBackward : public ::testing::TestWithParam<int> {};

TEST_P(NoBackward, AWindowWithoutBackwardAppliesNothing) {
  Result with = train(GetParam(), true);
  Result without = train(GetParam(), false);
  EXPECT_EQ(with.params, without.params) << "the empty window changed the training that followed";
  EXPECT_EQ(with.state.applied_steps, 4);
  EXPECT_EQ(with.state.skipped_steps, 1);
  EXPECT_EQ(with.state.global_steps, 5);
  EXPECT_EQ(without.state.global_steps, 4);
}

INSTANTIATE_TEST_SUITE_P(Stages, NoBackward, ::testing::Values(0, 1, 2, 3));

}  // namespace

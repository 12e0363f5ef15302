// Inf/NaN in the gradients of one rank: every rank skips the same optimizer step and keeps its weights,
// for fp32, bf16 and fp16 alike; with fp16, the dynamic loss scale goes down on the overflow and back up
// after loss_scale_window good steps, as the loss scaler defines it.
// zero3-test-ranks: 1 2 3 4
// zero3-test-extended: np4
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optim/loss_scaler.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Case {
  int stage;
  DType compute;
  float planted;
};

class Overflow : public ::testing::TestWithParam<Case> {};

Config config_for(const Case& k) {
  Config c = equivalence_config(k.stage);
  c.bf16.enabled = k.compute == DType::bf16;
  c.fp16.enabled = k.compute == DType::f16;
  // fp16 gradients are reduced in fp16 (DeepSpeed's default): a loss scale of 2^8 keeps this model's sums finite, so
  // only the planted value overflows.
  c.fp16.initial_scale_power = 8;
  return c;
}

TEST_P(Overflow, OneRanksInfSkipsTheStepEverywhere) {
  const Case k = GetParam();
  auto comm = engine_world();
  Config c = config_for(k);
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  const int64_t gas = e.gradient_accumulation_steps();
  const int last = comm->size() - 1;
  auto run_step = [&](int64_t step, bool plant) {
    StepResult r;
    for (int64_t micro = 0; micro < gas; ++micro) {
      Batch b = make_batch(d, 5, batch_index(step, micro, gas, comm->rank(), comm->size()), 3);
      mlp_micro_step(e, units, d, b, plant && micro == 0 && comm->rank() == last, k.planted);
      r = e.step();
    }
    return r;
  };
  EXPECT_TRUE(run_step(0, false).applied);
  auto before = gather_params(e);
  StepResult bad = run_step(1, true);
  EXPECT_TRUE(bad.boundary);
  EXPECT_FALSE(bad.applied) << "rank " << comm->rank();
  EXPECT_TRUE(bad.overflow) << "rank " << comm->rank();
  EXPECT_EQ(e.skipped_steps(), 1);
  EXPECT_EQ(gather_params(e), before) << "a skipped step must leave the weights untouched";
  // The gradients of the skipped step are gone: the next step trains normally.
  StepResult good = run_step(2, false);
  EXPECT_TRUE(good.applied);
  EXPECT_TRUE(std::isfinite(good.grad_norm));
  EXPECT_EQ(e.global_steps(), 3);
  EXPECT_NE(gather_params(e), before);
}

INSTANTIATE_TEST_SUITE_P(Engine, Overflow,
                         ::testing::Values(Case{3, DType::f32, std::numeric_limits<float>::infinity()},
                                           Case{2, DType::f32, std::numeric_limits<float>::quiet_NaN()},
                                           Case{0, DType::f32, -std::numeric_limits<float>::infinity()},
                                           Case{3, DType::bf16, std::numeric_limits<float>::quiet_NaN()},
                                           Case{1, DType::bf16, std::numeric_limits<float>::infinity()},
                                           Case{3, DType::f16, std::numeric_limits<float>::infinity()}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" +
                                  std::string(dtype_name(info.param.compute)) + "_" +
                                  (std::isnan(info.param.planted) ? "nan" : "inf");
                         });

TEST(LossScale, GoesDownOnOverflowAndBackUpAfterTheWindow) {
  auto comm = engine_world();
  Config c = equivalence_config(3);
  c.fp16.enabled = true;
  c.fp16.loss_scale = 0;  // dynamic
  c.fp16.initial_scale_power = 6;
  c.fp16.loss_scale_window = 2;
  c.fp16.hysteresis = 1;
  c.fp16.min_loss_scale = 1;
  c.gradient_accumulation_steps = 1;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  EXPECT_EQ(e.loss_scale(), 64.0);

  LossScaler expected(c.fp16);  // the scaler's own arithmetic, fed the same outcomes
  const bool plan[] = {false, true, false, false, false, false, true, true, false};
  const int last = comm->size() - 1;
  bool went_down = false, went_up = false;
  double prev = e.loss_scale();
  for (size_t step = 0; step < std::size(plan); ++step) {
    Batch b = make_batch(d, 3, batch_index(static_cast<int64_t>(step), 0, 1, comm->rank(), comm->size()), 2);
    mlp_micro_step(e, units, d, b, plan[step] && comm->rank() == last, std::numeric_limits<float>::infinity());
    StepResult r = e.step();
    bool applied = expected.update(plan[step]);
    EXPECT_EQ(r.applied, applied) << "step " << step;
    EXPECT_EQ(r.overflow, plan[step]) << "step " << step;
    EXPECT_EQ(r.loss_scale, expected.scale()) << "step " << step;
    EXPECT_EQ(e.loss_scale(), expected.scale());
    went_down |= r.loss_scale < prev;
    went_up |= r.loss_scale > prev;
    prev = r.loss_scale;
  }
  EXPECT_TRUE(went_down);
  EXPECT_TRUE(went_up);
  EXPECT_EQ(e.skipped_steps(), 3);
}

}  // namespace

// The check shared by the engine's equivalence tests: train the MLP of reference_model.hpp through the
// engine with a config variant and compare losses, gradient norms, learning rates and final weights with
// the unsharded single-process reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>

#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/reference_model.hpp"
#include "zero3/engine.hpp"

namespace zero3::testing {

struct Variant {
  std::string name;
  int stage;
  std::function<void(Config&)> change;
  double tolerance;  // relative, on losses, gradient norms and final weights
};

inline std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }
inline void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

inline void expect_equal_to_reference(const Variant& v) {
  auto comm = engine_world();
  Config c = equivalence_config(v.stage);
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;

  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  EngineRun run = train_mlp(engine, units, plan);
  ReferenceRun ref = run_reference(c, plan);

  const int rank = comm->rank();
  const int64_t gas = engine.gradient_accumulation_steps();
  ASSERT_EQ(static_cast<int64_t>(run.losses.size()), plan.steps * gas);
  bool clipped = false;
  double loss_err = 0;
  for (int64_t t = 0; t < plan.steps; ++t) {
    for (int64_t k = 0; k < gas; ++k) {
      double want = ref.losses[static_cast<size_t>(t)][static_cast<size_t>(k)][static_cast<size_t>(rank)];
      double got = run.losses[static_cast<size_t>(t * gas + k)];
      EXPECT_NEAR(got, want, v.tolerance * std::fabs(want))
          << "rank " << rank << ", step " << t << ", micro-step " << k;
      loss_err = std::max(loss_err, std::fabs(got - want) / std::fabs(want));
    }
    const StepResult& r = run.steps[static_cast<size_t>(t * gas + gas - 1)];
    ASSERT_TRUE(r.boundary);
    EXPECT_TRUE(r.applied) << "step " << t;
    EXPECT_NEAR(r.grad_norm, ref.grad_norms[static_cast<size_t>(t)],
                v.tolerance * ref.grad_norms[static_cast<size_t>(t)])
        << "step " << t;
    EXPECT_NEAR(r.lr, ref.lrs[static_cast<size_t>(t)], 1e-9) << "step " << t;
    clipped |= r.clip_coef < 1.0;
  }
  EXPECT_TRUE(clipped) << "the run should exercise gradient clipping";
  std::string worst;
  double err = max_relative_error(run.params, ref.params, &worst);
  EXPECT_LE(err, v.tolerance) << "largest weight difference at " << worst;
  ::testing::Test::RecordProperty("max_relative_weight_error", ::testing::PrintToString(err));
  ::testing::Test::RecordProperty("max_relative_loss_error", ::testing::PrintToString(loss_err));
}

}  // namespace zero3::testing

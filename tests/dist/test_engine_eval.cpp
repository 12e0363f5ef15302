// Evaluation (Engine::evaluate) on 1-3 ranks: a forward-only pass between optimizer steps gives the loss of the
// current weights, leaves training exactly as it would have been without it (same losses, same weights, same
// training schedule), has a schedule of its own (its second batch prefetches), refuses what needs gradients,
// and checks that every rank evaluates the same units in the same order.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/reference_model.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

constexpr uint64_t kEvalSeed = 99;

// The loss of `batch` under the gathered fp32 weights `p`, computed on the host with the model's arithmetic.
double host_loss(const std::map<std::string, std::vector<float>>& p, const MlpDims& d, const Batch& batch) {
  const int64_t B = batch.size;
  std::vector<float> a1(B * d.h1), a1n(B * d.h1), a2(B * d.h2), y(B * d.out);
  linear_forward(p.at("fc1.w").data(), p.at("fc1.b").data(), batch.x.data(), a1.data(), B, d.in, d.h1);
  for (auto& x : a1) x = std::tanh(x);
  const std::vector<float>& g = p.at("norm.g");
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t j = 0; j < d.h1; ++j) a1n[i * d.h1 + j] = a1[i * d.h1 + j] * g[j];
  }
  linear_forward(p.at("fc2.w").data(), p.at("fc2.b").data(), a1n.data(), a2.data(), B, d.h1, d.h2);
  for (auto& x : a2) x = std::tanh(x);
  linear_forward(p.at("head.w").data(), p.at("head.b").data(), a2.data(), y.data(), B, d.h2, d.out);
  return mse_loss(y, batch.t, B, nullptr);
}

// Trains `steps` optimizer steps; with `eval_batches` > 0, evaluates that many batches after every step and
// returns their losses in `eval_losses`.
EngineRun train_with_eval(Engine& e, const MlpUnits& units, const TrainPlan& plan, int64_t eval_batches,
                          std::vector<double>* eval_losses) {
  EngineRun run;
  const int64_t gas = e.gradient_accumulation_steps();
  const int rank = e.rank(), world = e.world_size();
  for (int64_t step = 0; step < plan.steps; ++step) {
    for (int64_t m = 0; m < gas; ++m) {
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, m, gas, rank, world), plan.micro_batch);
      run.losses.push_back(mlp_micro_step(e, units, plan.dims, b));
      run.steps.push_back(e.step());
    }
    if (eval_batches == 0) continue;
    EvalMode eval = e.evaluate();
    EXPECT_TRUE(e.evaluating());
    for (int64_t k = 0; k < eval_batches; ++k) {
      Batch b = make_batch(plan.dims, kEvalSeed, k * world + rank, plan.micro_batch);
      eval_losses->push_back(mlp_eval_loss(e, units, plan.dims, b));
      eval.next_batch();
    }
    eval.end();
    EXPECT_FALSE(e.evaluating());
  }
  run.params = gather_params(e);
  return run;
}

}  // namespace

// At every stage: the evaluation loss is the loss of the weights just trained (exactly, in fp32), and training
// with evaluations between its steps gives the bits of training without them.
TEST(Eval, LossOfTheCurrentWeightsAndTrainingUndisturbed) {
  auto comm = engine_world();
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config c = equivalence_config(stage);
    TrainPlan plan;
    plan.world = comm->size();
    plan.steps = 4;

    Engine plain(resolved_for(c, *comm), comm, cpu_device());
    MlpUnits pu = declare_mlp(plain, plan.dims);
    plain.materialize();
    const EngineRun want = train_with_eval(plain, pu, plan, 0, nullptr);

    Engine e(resolved_for(c, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(e, plan.dims);
    e.materialize();
    std::vector<double> eval_losses;
    const EngineRun got = train_with_eval(e, units, plan, 3, &eval_losses);
    expect_same_run(got, want);
    EXPECT_EQ(e.micro_steps(), plain.micro_steps());

    // The last evaluation ran on the final weights.
    ASSERT_EQ(eval_losses.size(), static_cast<size_t>(plan.steps * 3));
    for (int64_t k = 0; k < 3; ++k) {
      Batch b = make_batch(plan.dims, kEvalSeed, k * comm->size() + comm->rank(), plan.micro_batch);
      EXPECT_EQ(eval_losses[static_cast<size_t>((plan.steps - 1) * 3 + k)], host_loss(got.params, plan.dims, b))
          << "batch " << k;
    }
  }
}

// Stage 3: evaluation records its own order and prefetches along it from its second batch; the training trace
// is the same before and after, and the training micro-step after it prefetches as before.
TEST(Eval, OwnScheduleAtStageThree) {
  auto comm = engine_world();
  Config c = equivalence_config(3);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 2;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(e, plan.dims);
  e.materialize();
  train_mlp(e, units, plan);
  const std::vector<ScheduleEvent> trace = e.recorded_order();

  EvalMode eval = e.evaluate();
  const Batch b = make_batch(plan.dims, kEvalSeed, comm->rank(), plan.micro_batch);
  e.reset_schedule_stats();
  mlp_eval_loss(e, units, plan.dims, b);
  EXPECT_EQ(e.schedule_stats().prefetches, 0) << "the first evaluation batch has no order to follow yet";
  eval.next_batch();
  e.reset_schedule_stats();
  mlp_eval_loss(e, units, plan.dims, b);
  const ScheduleStats second = e.schedule_stats();
  EXPECT_GT(second.prefetches, 0) << "the second evaluation batch follows the first one's order";
  EXPECT_EQ(second.prefetch_hits, second.prefetches);
  eval.end();

  EXPECT_EQ(e.recorded_order(), trace) << "evaluation changed the order training follows";
  e.reset_schedule_stats();
  Batch t = make_batch(plan.dims, plan.data_seed, 1000 + comm->rank(), plan.micro_batch);
  mlp_micro_step(e, units, plan.dims, t);
  e.step();
  EXPECT_GT(e.schedule_stats().prefetch_hits, 0) << "training no longer follows its trace after evaluation";
}

TEST(Eval, RefusesWhatNeedsGradientsAndMidMicroStepStarts) {
  auto comm = engine_world();
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Engine e(resolved_for(equivalence_config(stage), *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(e, MlpDims{});
    e.materialize();
    {
      EvalMode eval = e.evaluate();
      EXPECT_THROW(e.backward_scope(units.head), InvalidArgument);
      EXPECT_THROW(e.step(), InvalidArgument);
      EXPECT_THROW(e.evaluate(), InvalidArgument);
      {
        UnitScope s = e.forward_scope(units.fc1);
        EXPECT_THROW(eval.end(), InvalidArgument) << "a scope is still open";
      }
    }  // the destructor ends evaluation
    EXPECT_FALSE(e.evaluating());

    // Inside a micro-step (scopes entered since the last step()), evaluation would interleave with it.
    { UnitScope s = e.forward_scope(units.fc1); }
    EXPECT_THROW(e.evaluate(), InvalidArgument);
    { UnitScope s = e.forward_scope(units.norm); }
    { UnitScope s = e.forward_scope(units.fc2); }
    { UnitScope s = e.forward_scope(units.head); }
    for (UnitId u : {units.head, units.fc2, units.norm, units.fc1}) UnitScope s = e.backward_scope(u);
    e.step();
    EvalMode eval = e.evaluate();
    EXPECT_TRUE(eval.active());
    eval.end();
    EXPECT_FALSE(eval.active());
    EXPECT_THROW(eval.next_batch(), InvalidArgument);
  }
}

// The first evaluation batch is checked like training's first micro-step: ranks that enter different units
// fail on every rank, with an error naming the evaluation batch.
TEST(Eval, DivergentOrderFailsOnEveryRank) {
  auto comm = engine_world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Engine e(resolved_for(equivalence_config(3), *comm), comm, cpu_device());
  MlpUnits units = declare_mlp(e, MlpDims{});
  e.materialize();
  EvalMode eval = e.evaluate();
  try {
    UnitScope s = e.forward_scope(comm->rank() == 0 ? units.fc1 : units.fc2);
    FAIL() << "expected CommError";
  } catch (const CommError& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("evaluation batch 0"), std::string::npos) << what;
    EXPECT_NE(what.find("forward_scope('fc1')"), std::string::npos) << what;
  }
}

// Pipelined training equals unpipelined training: the chain model of support/chain_model.hpp (8 layers) trained for
// 4 optimizer steps of 4 micro-batches with AdamW, gradient clipping and a WarmupLR schedule, on a PipelineEngine
// (2 and 4 stages; GPipe, 1F1B and interleaved 1F1B; ZeRO stage 1 and 3 inside the stages, and ZeRO 2-3 with
// zero3.pipeline_gradient_reduction "step": one reduce-scatter per step of the summed gradients) gives the same losses,
// gradient norms, learning rates and final weights as an unpipelined Engine over the same global batch: the same
// data-parallel size (the reference runs on a group of world / stages ranks), init and data order. fp32; the only
// difference is the order of the sums (the norm is summed per stage, then over the stages; the gradients of a
// step are summed over micro-batches in one micro-step), so the bound is round-off: 1e-5 relative.
// One pipeline rank with 4 virtual stages (every world size) hands activations and gradients between its own stages.
// Also: evaluation (eval_batch) equals the unpipelined forward, the stage's units are only its layers, and the
// shapes that cannot run are named errors.
// zero3-test-ranks: 1 2 4
// zero3-test-nodes: 2x2
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/chain_model.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"
#include "zero3/pipeline_engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

constexpr int64_t kMicroBatches = 4;
constexpr int kSteps = 4;

struct Case {
  int stages;
  const char* schedule;
  int virtual_stages;
  int zero_stage;
  bool reduce_once_per_step = false;  // zero3.pipeline_gradient_reduction "step"
};

std::string case_name(const Case& c) {
  return std::to_string(c.stages) + " stages, " + c.schedule +
         (c.virtual_stages > 1 ? " x" + std::to_string(c.virtual_stages) : std::string()) + ", ZeRO " +
         std::to_string(c.zero_stage) + (c.reduce_once_per_step ? ", gradients reduced once per step" : "");
}

Config chain_config(int zero_stage) {
  Config c = equivalence_config(zero_stage);
  c.gradient_accumulation_steps = kMicroBatches;
  c.train_micro_batch_size_per_gpu = ChainDims{}.micro_batch;
  c.zero.param_persistence_threshold = 30;  // the smallest layers stay gathered, the rest are gathered per scope
  c.zero.reduce_bucket_size = 300;
  return c;
}

struct TrainedRun {
  std::vector<double> losses;  // per step: the global batch's mean loss
  std::vector<StepResult> steps;
  std::map<std::string, std::vector<float>> params;  // the units this rank holds (pipelined) or all (reference)
  double eval_loss = 0;
};

std::map<std::string, std::vector<float>> gather_units(Engine& e) {
  std::map<std::string, std::vector<float>> out;
  for (size_t u = 0; u < e.num_units(); ++u) {
    const UnitInfo& info = e.unit(UnitId{static_cast<int32_t>(u)});
    std::vector<float> v(static_cast<size_t>(info.numel));
    e.gather_master_params(info.id, v.data());
    out[info.name] = std::move(v);
  }
  return out;
}

// The unpipelined run over `group` (world / stages ranks): gradient accumulation over the micro-batches.
TrainedRun reference_run(const std::shared_ptr<Communicator>& group, int zero_stage, const ChainDims& d) {
  Engine e(resolved_for(chain_config(zero_stage), *group), group, cpu_device());
  for (size_t i = 0; i < d.layers(); ++i) e.add_unit(chain_layer_name(i), chain_layer_params(d, i));
  e.materialize();
  TrainedRun run;
  for (int step = 0; step < kSteps; ++step) {
    float loss = 0.0f;
    for (int64_t k = 0; k < kMicroBatches; ++k) {
      loss += static_cast<float>(train_chain_micro_step(e, d, step * kMicroBatches + k));
      StepResult r = e.step();
      if (r.boundary) run.steps.push_back(r);
    }
    loss /= kMicroBatches;
    e.all_reduce_host(&loss, 1, ReduceOp::avg);
    run.losses.push_back(loss);
  }
  // Evaluation: one more global batch's forward (data indices from 0, as eval_batch counts them).
  {
    EvalMode eval = e.evaluate();
    float loss = 0.0f;
    for (int64_t k = 0; k < kMicroBatches; ++k) {
      Batch b = chain_batch(d, k, e.rank(), e.world_size());
      auto acts = chain_forward(e, d, 0, d.layers(), b.x.data());
      loss += static_cast<float>(chain_loss(d, b, acts.back(), 1.0, nullptr));
    }
    eval.end();
    loss /= kMicroBatches;
    e.all_reduce_host(&loss, 1, ReduceOp::avg);
    run.eval_loss = loss;
  }
  run.params = gather_units(e);
  return run;
}

TrainedRun pipelined_run(const std::shared_ptr<Communicator>& world, const Case& c, const ChainDims& d) {
  Config config = chain_config(c.zero_stage);
  config.pipeline.stages = c.stages;
  config.zero3.pipeline_schedule = c.schedule;
  config.zero3.pipeline_virtual_stages = c.virtual_stages;
  config.zero3.pipeline_reduce_once_per_step = c.reduce_once_per_step;
  ResolveInputs in;
  in.world_size = world->size();
  resolve(config, in);
  ChainStages model(d);
  PipelineEngine pipe(config, world, cpu_device(), chain_pipeline_layers(d), model);
  // Only the stage's layers are declared on this rank.
  size_t held = 0;
  for (const PipelineStageInfo& s : pipe.stages()) held += s.end_layer - s.first_layer;
  EXPECT_EQ(pipe.engine().num_units(), held);
  EXPECT_EQ(pipe.data_parallel_size(), world->size() / c.stages);
  TrainedRun run;
  for (int step = 0; step < kSteps; ++step) {
    PipelineStepResult r = pipe.train_batch();
    EXPECT_TRUE(r.step.boundary);
    EXPECT_EQ(model.kept(), 0u) << "a micro-batch's activations outlived its backward";
    run.losses.push_back(r.loss);
    run.steps.push_back(r.step);
  }
  run.eval_loss = pipe.eval_batch();
  run.params = gather_units(pipe.engine());
  return run;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

void expect_same(const TrainedRun& got, const TrainedRun& want, const std::string& what) {
  constexpr double kTol = 1e-5;
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  ASSERT_EQ(got.steps.size(), want.steps.size()) << what;
  for (size_t s = 0; s < got.losses.size(); ++s) {
    EXPECT_LT(rel(got.losses[s], want.losses[s]), kTol) << what << ", step " << s << ": loss " << got.losses[s]
                                                        << " vs " << want.losses[s];
    EXPECT_LT(rel(got.steps[s].grad_norm, want.steps[s].grad_norm), kTol)
        << what << ", step " << s << ": grad norm " << got.steps[s].grad_norm << " vs " << want.steps[s].grad_norm;
    EXPECT_EQ(got.steps[s].applied, want.steps[s].applied) << what << ", step " << s;
    EXPECT_DOUBLE_EQ(got.steps[s].lr, want.steps[s].lr) << what << ", step " << s;
    EXPECT_NEAR(got.steps[s].clip_coef, want.steps[s].clip_coef, kTol) << what << ", step " << s;
  }
  EXPECT_LT(rel(got.eval_loss, want.eval_loss), kTol) << what << ": eval loss " << got.eval_loss << " vs "
                                                      << want.eval_loss;
  // The pipelined rank holds some layers: each equals the reference's.
  std::map<std::string, std::vector<float>> want_held;
  for (const auto& [name, v] : got.params) {
    ASSERT_TRUE(want.params.count(name)) << what << ": " << name;
    want_held[name] = want.params.at(name);
  }
  std::string worst;
  const double err = max_relative_error(got.params, want_held, &worst);
  EXPECT_LT(err, kTol) << what << ": weights differ by " << err << " (worst: " << worst << ")";
}

TEST(PipelineEquivalence, EveryScheduleAndStageCountEqualsTheUnpipelinedRun) {
  auto world = engine_world();
  const int w = world->size();
  const ChainDims d;
  const std::vector<Case> cases = {
      {1, "interleaved_1f1b", 4, 1},
      {1, "interleaved_1f1b", 4, 3},
      {2, "gpipe", 1, 1},
      {2, "1f1b", 1, 1},
      {2, "1f1b", 1, 3},
      {2, "gpipe", 1, 3},
      {2, "interleaved_1f1b", 2, 1},
      {2, "interleaved_1f1b", 2, 3},
      {4, "gpipe", 1, 1},
      {4, "1f1b", 1, 1},
      {4, "1f1b", 1, 3},
      {4, "interleaved_1f1b", 2, 3},
      {4, "gpipe", 1, 3},
      {2, "1f1b", 1, 3, true},
      {4, "1f1b", 1, 3, true},
      {2, "gpipe", 1, 2, true},
      {1, "interleaved_1f1b", 4, 3, true},
  };
  std::map<std::pair<int, int>, TrainedRun> references;  // (data-parallel size, ZeRO stage)
  int ran = 0;
  for (const Case& c : cases) {
    if (w % c.stages != 0) continue;
    const int dp = w / c.stages;
    // The reference over the same data-parallel size: consecutive groups of dp ranks, each the whole model.
    auto key = std::make_pair(dp, c.zero_stage);
    if (!references.count(key)) {
      std::shared_ptr<Communicator> group(world->split(world->rank() / dp, world->rank() % dp));
      references[key] = reference_run(group, c.zero_stage, d);
    }
    SCOPED_TRACE(case_name(c));
    expect_same(pipelined_run(world, c, d), references.at(key), case_name(c));
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

Config pipelined_config(const Communicator& world, int stages, const char* schedule, int virtual_stages,
                        const std::string& partition = "parameters") {
  Config config = chain_config(1);
  config.pipeline.stages = stages;
  config.pipeline.partition = partition;
  config.zero3.pipeline_schedule = schedule;
  config.zero3.pipeline_virtual_stages = virtual_stages;
  ResolveInputs in;
  in.world_size = world.size();
  resolve(config, in);
  return config;
}

template <typename E>
void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with: " << text;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(PipelineEquivalence, ShapesThatCannotRunAreNamed) {
  auto world = engine_world();
  const ChainDims d;
  ChainStages model(d);
  // 1 pipeline rank x 12 virtual stages for 8 layers.
  expect_error<ConfigError>(
      [&] {
        PipelineEngine p(pipelined_config(*world, 1, "interleaved_1f1b", 12), world, cpu_device(),
                         chain_pipeline_layers(d), model);
      },
      "pipeline.stages: 12 stages for 8 layers");
  // A partition regex that matches no layer.
  expect_error<ConfigError>(
      [&] {
        PipelineEngine p(pipelined_config(*world, 1, "interleaved_1f1b", 2, "type:Attention"), world, cpu_device(),
                         chain_pipeline_layers(d), model);
      },
      "pipeline.partition: \"type:Attention\" matches none of the layers");
  // A stage boundary after a layer without an output size.
  auto layers = chain_pipeline_layers(d);
  for (auto& l : layers) l.output_numel = 0;
  expect_error<InvalidArgument>(
      [&] {
        PipelineEngine p(pipelined_config(*world, 1, "interleaved_1f1b", 2), world, cpu_device(), layers, model);
      },
      "its output_numel is 0; the activation sent to the next stage needs its element count");
  // A plain Engine over the world refuses a pipelined config and names the PipelineEngine.
  if (world->size() >= 2) {
    expect_error<InvalidArgument>([&] { Engine e(pipelined_config(*world, 2, "1f1b", 1), world, cpu_device()); },
                                  "runs on a zero3::PipelineEngine");
  }
}

// Started by test_launch_command under `zero3 launch -n 4 --keep-going` with DIST_TEST_KILLED_STAGE=1: 4 stages
// of 1F1B, and stage 1 is killed (SIGKILL) in its forward of micro-batch 2 of the second step. Every other rank's
// train_batch() must end with a CommError naming the pipeline stage, the transfer and its micro-batch, within the
// communicator's 60 s timeout (it sees the dead rank, or the neighbour that stopped because of it).
TEST(PipelineFailure, AKilledStageEndsEveryRankWithANamedError) {
  if (std::getenv("DIST_TEST_KILLED_STAGE") == nullptr) {
    GTEST_SKIP() << "runs under test_launch_command (DIST_TEST_KILLED_STAGE)";
  }
  auto world = engine_world();
  ASSERT_EQ(world->size(), 4);
  struct Killed : ChainStages {
    using ChainStages::ChainStages;
    double forward(Engine& e, const PipelineCall& c) override {
      if (c.stage->stage == 1 && c.data_index == kMicroBatches + 2) {
        std::printf("stage 1 is killed in its forward of micro-batch 2 of step 2\n");
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      return ChainStages::forward(e, c);
    }
  };
  Config config = chain_config(1);
  config.pipeline.stages = 4;
  ResolveInputs in;
  in.world_size = world->size();
  resolve(config, in);
  const ChainDims d;
  Killed model(d);
  PipelineEngine pipe(config, world, cpu_device(), chain_pipeline_layers(d), model);
  pipe.train_batch();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    pipe.train_batch();
    ADD_FAILURE() << "the step finished although stage 1 was killed";
  } catch (const CommError& e) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    std::printf("rank %d saw after %lld ms: %s\n", world->rank(), static_cast<long long>(took.count()), e.what());
    std::fflush(stdout);
    const std::string what = e.what();
    EXPECT_NE(what.find("pipeline stage " + std::to_string(world->rank())), std::string::npos) << what;
    EXPECT_NE(what.find("of micro-batch "), std::string::npos) << what;
    EXPECT_LT(took, std::chrono::seconds(60)) << "within the timeout";
  }
  // The pipeline engine stays failed: the next call names the same error at once.
  EXPECT_THROW(pipe.train_batch(), CommError);
}

}  // namespace

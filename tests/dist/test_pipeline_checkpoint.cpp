// Checkpoints of a PipelineEngine (zero3/pipeline_checkpoint.hpp): a chain of 8 layers (tanh between them, a squared
// error on the last) trained by the pipeline engine at 4 stages on 4 ranks, saved after 3 optimizer steps, and resumed
// at 2 stages (2 stages x 2 data-parallel ranks), at 1 stage (an Engine over the 4 ranks without a pipeline, the same
// model run micro-step by micro-step) and at 4 stages again. The global batch is the same 8 micro-batches per step in
// every layout (the micro-batch of data index t * micro_batches + k on data-parallel rank r is sample (t *
// micro_batches + k) * data_parallel + r, as the unpipelined engine's micro-step k of step t on rank r). Right after
// each load the weights and Adam state are bit for bit the saved ones; 3 steps later the losses and the state equal the
// uninterrupted 4-stage run's: bit for bit at 4 stages, within fp32 round-off at 2 stages and without a pipeline (other
// data-parallel sizes and accumulation orders sum the gradients in another order).
// zero3-test-ranks: 4
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/pipeline_checkpoint.hpp"
#include "zero3/pipeline_engine.hpp"

namespace zero3::testing {
namespace {

constexpr int kLayers = 8;
constexpr int64_t kMicroBatches = 8;  // per optimizer step, over all data-parallel ranks
constexpr int64_t kBatch = 2;         // samples per micro-batch
constexpr int64_t kSaved = 3,
                  kMore = 3;  // optimizer steps before and after the checkpoint
constexpr double kTolerance = 1e-5;

int64_t width(int l) { return 4 + (l * 2) % 3; }  // layer l maps width(l) to width(l + 1) features
std::string layer_name(int l) { return "layers." + std::to_string(l); }

std::vector<PipelineLayer> chain_layers() {
  std::vector<PipelineLayer> layers;
  for (int l = 0; l < kLayers; ++l) {
    layers.push_back({layer_name(l), width(l + 1) * width(l) + width(l + 1), kBatch * width(l + 1)});
  }
  return layers;
}

// Sample values of global micro-batch `sample`: its inputs (kBatch x width(0)) and targets (kBatch x width(kLayers)).
float input_value(int64_t sample, int64_t i) { return static_cast<float>(std::sin(0.7 * (sample + 1) + 0.31 * i)); }
float target_value(int64_t sample, int64_t i) {
  return static_cast<float>(0.5 * std::cos(0.4 * (sample + 2) + 0.23 * i));
}

// The chain's stages. Works as any stage of a pipeline and, given the whole chain as its stage, on an Engine alone.
class Chain : public PipelineModel {
 public:
  void declare(Engine& e, const PipelineStageInfo& s) override {
    for (size_t l = s.first_layer; l < s.end_layer; ++l) {
      const int li = static_cast<int>(l);
      e.add_unit(layer_name(li), {{"w", {width(li + 1), width(li)}, ParamInit::normal(0.5)},
                                  {"b", {width(li + 1)}, ParamInit::uniform(-0.1, 0.1)}});
    }
  }

  double forward(Engine& e, const PipelineCall& c) override {
    const PipelineStageInfo& s = *c.stage;
    const int64_t sample = global_sample(e, c.data_index);
    std::vector<float> x(static_cast<size_t>(kBatch * width(static_cast<int>(s.first_layer))));
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = s.is_first() ? input_value(sample, static_cast<int64_t>(i)) : c.input.as<float>()[i];
    }
    std::vector<std::vector<float>>& kept = kept_[c.micro_batch];
    kept.clear();
    for (size_t l = s.first_layer; l < s.end_layer; ++l) {
      const int li = static_cast<int>(l);
      UnitScope scope = e.forward_scope(*e.find_unit(layer_name(li)));
      const float* w = scope.param("w").as<float>();
      const float* b = scope.param("b").as<float>();
      const int64_t in = width(li), out = width(li + 1);
      std::vector<float> y(static_cast<size_t>(kBatch * out));
      for (int64_t n = 0; n < kBatch; ++n) {
        for (int64_t o = 0; o < out; ++o) {
          float acc = b[o];
          for (int64_t k = 0; k < in; ++k) acc += w[o * in + k] * x[static_cast<size_t>(n * in + k)];
          y[static_cast<size_t>(n * out + o)] = li + 1 < kLayers ? std::tanh(acc) : acc;
        }
      }
      kept.push_back(std::move(x));
      x = std::move(y);
    }
    kept.push_back(x);  // the stage's output
    if (!s.is_last()) {
      std::copy(x.begin(), x.end(), c.output.as<float>());
      return 0;
    }
    double loss = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = x[i] - target_value(sample, static_cast<int64_t>(i));
      loss += 0.5 * d * d / static_cast<double>(x.size());
    }
    return loss;
  }

  void backward(Engine& e, const PipelineCall& c) override {
    const PipelineStageInfo& s = *c.stage;
    const int64_t sample = global_sample(e, c.data_index);
    std::vector<std::vector<float>>& kept = kept_.at(c.micro_batch);
    std::vector<float> dy = kept.back();
    for (size_t i = 0; i < dy.size(); ++i) {
      dy[i] = s.is_last() ? static_cast<float>((dy[i] - target_value(sample, static_cast<int64_t>(i))) /
                                               static_cast<double>(dy.size()) * e.loss_scale())
                          : c.grad_output.as<float>()[i];
    }
    for (size_t l = s.end_layer; l-- > s.first_layer;) {
      const int li = static_cast<int>(l);
      const std::vector<float>& x = kept[l - s.first_layer];
      const std::vector<float>& y = kept[l - s.first_layer + 1];
      const int64_t in = width(li), out = width(li + 1);
      if (li + 1 < kLayers) {
        for (size_t i = 0; i < dy.size(); ++i) dy[i] *= 1.0f - y[i] * y[i];
      }
      UnitScope scope = e.backward_scope(*e.find_unit(layer_name(li)));
      const float* w = scope.param("w").as<float>();
      float* gw = scope.grad("w").as<float>();
      float* gb = scope.grad("b").as<float>();
      std::vector<float> dx(static_cast<size_t>(kBatch * in), 0.0f);
      for (int64_t n = 0; n < kBatch; ++n) {
        for (int64_t o = 0; o < out; ++o) {
          const float g = dy[static_cast<size_t>(n * out + o)];
          gb[o] += g;
          for (int64_t k = 0; k < in; ++k) {
            gw[o * in + k] += g * x[static_cast<size_t>(n * in + k)];
            dx[static_cast<size_t>(n * in + k)] += g * w[o * in + k];
          }
        }
      }
      dy = std::move(dx);
    }
    if (!s.is_first()) std::copy(dy.begin(), dy.end(), c.grad_input.as<float>());
    kept_.erase(c.micro_batch);
  }

 private:
  // The unpipelined engine's sample for micro-batch `data_index` (= step x micro-batches + micro) on this rank.
  static int64_t global_sample(const Engine& e, int64_t data_index) {
    const int64_t per_rank = kMicroBatches / e.world_size();
    return batch_index(data_index / per_rank, data_index % per_rank, per_rank, e.rank(), e.world_size());
  }
  std::map<int64_t, std::vector<std::vector<float>>> kept_;
};

Config config_for(int zero_stage, int stages, int world) {
  Config c = equivalence_config(zero_stage);
  c.pipeline.stages = stages;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = kMicroBatches / (world / stages);
  c.train_batch_size = kMicroBatches;
  c.zero3.pipeline_schedule = "1f1b";
  ResolveInputs in;
  in.world_size = world;
  resolve(c, in);
  return c;
}

// The same chain on an Engine without a pipeline: every micro-step one micro-batch through all layers.
struct PlainChain {
  PlainChain(const Config& config, std::shared_ptr<Communicator> comm) : engine(config, std::move(comm), cpu_device()) {
    whole.stages = 1;
    whole.end_layer = kLayers;
    chain.declare(engine, whole);
    engine.materialize();
  }
  std::vector<double> train(int64_t first, int64_t steps) {
    std::vector<double> losses;
    const int64_t gas = engine.gradient_accumulation_steps();
    for (int64_t t = first; t < first + steps; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < gas; ++k) {
        PipelineCall call;
        call.stage = &whole;
        call.micro_batch = k;
        call.data_index = t * gas + k;
        sum += chain.forward(engine, call);
        chain.backward(engine, call);
        engine.step();
      }
      float mean = static_cast<float>(sum / static_cast<double>(gas));
      engine.all_reduce_host(&mean, 1, ReduceOp::avg);
      losses.push_back(mean);
    }
    return losses;
  }
  Engine engine;
  Chain chain;
  PipelineStageInfo whole;
};

std::vector<double> train(PipelineEngine& pipe, int64_t steps) {
  std::vector<double> losses;
  for (int64_t t = 0; t < steps; ++t) losses.push_back(pipe.train_batch().loss);
  return losses;
}

// The chain's units: names and sizes.
std::vector<std::pair<std::string, int64_t>> chain_units() {
  std::vector<std::pair<std::string, int64_t>> units;
  for (int l = 0; l < kLayers; ++l) units.emplace_back(layer_name(l), width(l + 1) * width(l) + width(l + 1));
  return units;
}

// The whole model's state on every rank of the world.
std::map<std::string, std::vector<float>> model_state(Engine& engine, Communicator& world) {
  return world_state(&engine, world, chain_units());
}

void expect_losses_near(const std::vector<double>& got, const std::vector<double>& want, bool exact) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (exact) {
      EXPECT_EQ(got[i], want[i]) << "step " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], kTolerance * std::max(1.0, std::abs(want[i]))) << "step " << i;
    }
  }
}

class PipelineCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(PipelineCheckpoint, SavedAtFourStagesResumesAtTwoStagesAndWithoutAPipeline) {
  auto world = engine_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int zero_stage = GetParam();
  SharedTempDir dir(*world, "zero3-pipe-ckpt");
  Chain chain;

  // The uninterrupted run.
  std::vector<double> want_losses;
  std::map<std::string, std::vector<float>> want;
  {
    PipelineEngine pipe(config_for(zero_stage, 4, 4), world, cpu_device(), chain_layers(), chain);
    want_losses = train(pipe, kSaved + kMore);
    want = model_state(pipe.engine(), *world);
  }
  std::map<std::string, std::vector<float>> saved;
  {
    PipelineEngine pipe(config_for(zero_stage, 4, 4), world, cpu_device(), chain_layers(), chain);
    const std::vector<double> losses = train(pipe, kSaved);
    expect_losses_near(losses, std::vector<double>(want_losses.begin(), want_losses.begin() + kSaved), true);
    saved = model_state(pipe.engine(), *world);
    save_checkpoint(pipe, dir.path(), "global_step3", {{"next_step", "3"}});
  }
  const CheckpointInfo info = verify_checkpoint(dir.path());
  EXPECT_EQ(info.pipeline_stages, 4);
  EXPECT_EQ(info.training_state.micro_steps, kSaved * kMicroBatches);
  const std::vector<double> want_after(want_losses.begin() + kSaved, want_losses.end());

  for (const int stages : {4, 2}) {
    SCOPED_TRACE("resumed at " + std::to_string(stages) + " stages, ZeRO stage " + std::to_string(zero_stage));
    PipelineEngine pipe(config_for(zero_stage, stages, 4), world, cpu_device(), chain_layers(), chain);
    const LoadedCheckpoint loaded = load_checkpoint(pipe, dir.path());
    EXPECT_EQ(loaded.saved_pipeline_stages, 4);
    EXPECT_EQ(loaded.extra_int("next_step"), 3);
    EXPECT_EQ(pipe.global_steps(), kSaved);
    EXPECT_EQ(first_bit_difference(model_state(pipe.engine(), *world), saved), "");
    expect_losses_near(train(pipe, kMore), want_after, stages == 4);
    std::string worst;
    const double err = max_relative_error(model_state(pipe.engine(), *world), want, &worst);
    EXPECT_LE(err, stages == 4 ? 0.0 : kTolerance) << "largest difference at " << worst;
    ::testing::Test::RecordProperty(
        "max_relative_error_" + std::to_string(stages) + "_stages_z" + std::to_string(zero_stage),
        ::testing::PrintToString(err));
  }
  {
    SCOPED_TRACE("resumed on an Engine without a pipeline, ZeRO stage " + std::to_string(zero_stage));
    PlainChain plain(config_for(zero_stage, 1, 4), world);
    const LoadedCheckpoint loaded = load_checkpoint(plain.engine, dir.path());
    EXPECT_EQ(loaded.saved_pipeline_stages, 4);
    EXPECT_EQ(plain.engine.micro_steps(), kSaved * plain.engine.gradient_accumulation_steps());
    EXPECT_EQ(first_bit_difference(model_state(plain.engine, *world), saved), "");
    expect_losses_near(plain.train(kSaved, kMore), want_after, false);
    std::string worst;
    const double err = max_relative_error(model_state(plain.engine, *world), want, &worst);
    EXPECT_LE(err, kTolerance) << "largest difference at " << worst;
    ::testing::Test::RecordProperty("max_relative_error_unpipelined_z" + std::to_string(zero_stage),
                                    ::testing::PrintToString(err));
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, PipelineCheckpoint, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "Zero" + std::to_string(i.param); });

}  // namespace
}  // namespace zero3::testing

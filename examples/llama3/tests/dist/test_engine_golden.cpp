// The golden checks of tests/golden (transformers' LlamaForCausalLM, float32) through the ZeRO engine at stage 3,
// on 1, 2 and 3 ranks: the weights enter through the engine's pretrained init (each rank reads only its slices
// of model.safetensors), the batch's two sequences are split over ranks and micro-batches, and the loss and
// every parameter's averaged gradient must equal the fixture's. Fixtures: the tiny Llama (untied), the same with
// tied embeddings (the embedding unit entered by the head's scope too, its two gradients added by the engine),
// and the vocabulary of 32768 (tied).
//
// How the gradient is read through the public API: the first optimizer step runs AdamW with beta1 = 0 and no
// clipping, so each rank's exp_avg (ShardView) after it is exactly (1 - 0) * g = the reduced, averaged gradient
// of its slice, which the rank compares with the fixture's elements of that slice. The ranks' compared element
// counts add up to the whole model.
//
// Split: with W ranks and G = ceil(2 / W) micro-batches, rank r's micro-batch k is sequence k*W + r, or, past
// the second sequence (3 ranks), a sequence whose targets are all ignored: it contributes compute and
// collectives but no loss and no gradient. The loss normalizer is the step's target count / (W x G)
// (step_loss_normalizer), so the engine's mean over ranks and micro-batches is the mean over the batch's targets.
//
// Tolerances are the single-process golden test's (test_golden_hf.cpp): loss 1e-5 relative (and 2e-6 of the float64
// loss where the fixture has one), each gradient within 1e-4 of its tensor's largest |gradient|; the reduction adds
// one more order of float additions, far below.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include "engine_model.hpp"
#include "support/engine_world.hpp"
#include "tests/golden_fixture.hpp"
#include "zero3/engine.hpp"
#include "zero3/safetensors.hpp"

using namespace llama3;
namespace fs = std::filesystem;
namespace st = zero3::safetensors;

namespace {

zero3::Config golden_config(int64_t gas) {
  zero3::Config c;
  c.zero.stage = 3;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = gas;
  c.gradient_clipping = 0.0;
  c.optimizer.present = true;
  c.optimizer.type = zero3::OptimizerType::adamw;
  c.optimizer.lr = 1e-3;
  c.optimizer.beta1 = 0.0;  // exp_avg after the first step = the gradient
  c.optimizer.weight_decay = 0.0;
  c.zero.reduce_bucket_size = 5000;  // units span several buckets
  c.zero.prefetch_bucket_size = 30000;
  c.zero.param_persistence_threshold = 10;  // no unit is that small: every unit is gathered and released
  c.zero3.seed = 1;
  return c;
}

struct GoldenCase {
  const char* fixture;  // "" (tests/golden itself), "tied", "vocab32k"
  bool checkpointing;
};

class EngineGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(EngineGolden, LossAndGradientsEqualTransformers) {
  auto comm = zero3::testing::engine_world();
  const int W = comm->size(), rank = comm->rank();
  const llama3::testing::GoldenFixture golden(GetParam().fixture);
  const fs::path& dir = golden.dir;
  const ModelConfig& mc = golden.config;
  const std::vector<int32_t>& ids = golden.ids;
  const std::vector<int32_t>& targets = golden.targets;
  const double want_loss = golden.loss;
  const int64_t S = golden.shape.batch, T = golden.shape.seq;

  const int64_t G = (S + W - 1) / W;
  zero3::Engine engine(zero3::testing::resolved_for(golden_config(G), *comm), comm, zero3::testing::cpu_device());
  EngineModelOptions opt;
  opt.init_from = dir / "model.safetensors";
  opt.activation_checkpointing = GetParam().checkpointing;
  EngineModel model(engine, mc, opt);
  engine.materialize();

  // This rank's micro-batches.
  std::vector<std::vector<int32_t>> mb_ids, mb_targets;
  int64_t local_count = 0;
  for (int64_t k = 0; k < G; ++k) {
    const int64_t seq = k * W + rank;
    const int64_t src = seq < S ? seq : 0;
    mb_ids.emplace_back(ids.begin() + src * T, ids.begin() + (src + 1) * T);
    if (seq < S) {
      mb_targets.emplace_back(targets.begin() + seq * T, targets.begin() + (seq + 1) * T);
    } else {
      mb_targets.emplace_back(static_cast<size_t>(T), kIgnoreIndex);
    }
    local_count += count_targets(mb_targets.back().data(), T, mc.vocab_size);
  }
  LossOptions lo;
  lo.normalizer = step_loss_normalizer(engine, local_count, G);
  double loss_sum = 0;
  zero3::StepResult r;
  for (int64_t k = 0; k < G; ++k) {
    LossResult l = model.forward_backward(mb_ids[k].data(), mb_targets[k].data(), BatchShape{1, T}, lo);
    loss_sum += l.loss_sum;
    r = engine.step();
  }
  ASSERT_TRUE(r.boundary);
  ASSERT_TRUE(r.applied);
  float sums[2] = {static_cast<float>(loss_sum), static_cast<float>(local_count)};
  engine.all_reduce_host(sums, 2);  // after the engine's queued gathers
  const double loss = sums[0] / sums[1];
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
  // vocab32k: the float64 cross-entropy of transformers' logits, as test_golden_hf.cpp checks it.
  if (golden.loss_f64 > 0) {
    EXPECT_NEAR(loss, golden.loss_f64, 2e-6 * golden.loss_f64);
  }

  // The gradients, slice by slice.
  const st::SafetensorsReader& grads = *golden.grads;
  std::map<std::string, std::vector<float>> want;
  std::map<std::string, double> scale;  // the tensor's largest |gradient|
  double norm_sq = 0;
  for (const st::TensorInfo& t : grads.tensors()) {
    auto& v = want[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    grads.read_as_f32(t.name, 0, t.numel(), v.data());
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x))), norm_sq += static_cast<double>(x) * x;
    scale[t.name] = m;
  }
  EXPECT_NEAR(r.grad_norm, std::sqrt(norm_sq), 1e-5 * std::sqrt(norm_sq));

  int64_t compared = 0;
  double worst = 0;
  std::string worst_name;
  for (size_t u = 0; u < model.num_units(); ++u) {
    const zero3::ShardView shard = engine.local_shard(model.unit(u));
    for (const zero3::ParamSlice& ps : engine.slice_params(model.unit(u), rank)) {
      const std::string& name = engine.param(ps.param).local_name;
      ASSERT_TRUE(want.count(name)) << name;
      const std::vector<float>& w = want[name];
      for (int64_t i = ps.param_begin; i < ps.param_end; ++i) {
        const double got = shard.exp_avg[ps.slice_offset + (i - ps.param_begin)];
        const double err = std::fabs(got - w[static_cast<size_t>(i)]) / scale[name];
        if (err > worst) worst = err, worst_name = name + "[" + std::to_string(i) + "]";
      }
      compared += ps.param_end - ps.param_begin;
    }
  }
  EXPECT_LE(worst, 1e-4) << "rank " << rank << ": worst gradient " << worst_name;
  float total = static_cast<float>(compared);
  engine.all_reduce_host(&total, 1);
  EXPECT_EQ(static_cast<int64_t>(total), mc.num_parameters());
  std::printf(
      "[%s, rank %d of %d, checkpointing %s] loss %.9f vs %.9f (rel %.2g); grad norm %.9f vs %.9f; worst "
      "gradient %.3g (%s)\n",
      *GetParam().fixture ? GetParam().fixture : "untied", rank, W, GetParam().checkpointing ? "on" : "off", loss,
      want_loss, std::fabs(loss - want_loss) / want_loss, r.grad_norm, std::sqrt(norm_sq), worst, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Stage3, EngineGolden,
                         ::testing::Values(GoldenCase{"", true}, GoldenCase{"", false}, GoldenCase{"tied", true},
                                           GoldenCase{"tied", false}, GoldenCase{"vocab32k", true}),
                         [](const ::testing::TestParamInfo<GoldenCase>& i) {
                           return std::string(*i.param.fixture ? i.param.fixture : "untied") +
                                  (i.param.checkpointing ? "_checkpointing" : "_no_checkpointing");
                         });

}  // namespace

// A torch::nn model trained through the libtorch adapter equals the same model trained by plain libtorch with
// torch::optim::AdamW in one process (same initialization, same global batches in the same order, clip_grad_norm_)
// at ZeRO stages 0-3, with and without activation checkpointing of the blocks, with and without gradient
// accumulation, with the optimizer offloaded to CPU or NVMe, and with a tied embedding (a root parameter used inside
// the head's unit): the losses of every step
// and the final weights agree within fp32 round-off (the gradients are summed in another order). And at stage 3 no
// parameter tensor is at full size outside its unit's call or backward (counted on the tensors during the run).
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "support/engine_world.hpp"
#include "support/expect_same_training.hpp"
#include "support/libtorch_training.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"

namespace zero3::testing {
namespace {

constexpr uint64_t kSeed = 1234;
// Relative to each tensor's scale. The gradients agree to about 1e-6 (the norms are compared at 1e-5); Adam divides
// each gradient by its own running magnitude, which carries the last bits of small gradients into the weights.
constexpr double kTolerance = 1e-4;

struct Variant {
  int stage;
  bool checkpoint;
  int64_t gas;
  bool tie;
  OffloadDevice offload_optimizer = OffloadDevice::none;
};

std::string describe(const Variant& v) {
  return "stage " + std::to_string(v.stage) + (v.checkpoint ? ", checkpointed blocks" : "") + ", accumulation " +
         std::to_string(v.gas) + (v.tie ? ", tied embedding" : "") +
         (v.offload_optimizer == OffloadDevice::cpu    ? ", optimizer offloaded to CPU"
          : v.offload_optimizer == OffloadDevice::nvme ? ", optimizer offloaded to NVMe"
                                                       : "");
}

libtorch::WrapOptions wrap_options(const TinyLlamaConfig& c, bool checkpoint) {
  libtorch::WrapOptions o;
  o.units = tiny_llama_units(c);
  if (checkpoint) {
    for (const std::string& u : o.units) {
      if (u.rfind("blocks.", 0) == 0) o.checkpoint.push_back(u);
    }
  }
  return o;
}

const TrainRun& reference(const TinyLlamaConfig& c, const TrainSpec& spec) {
  static std::map<std::tuple<bool, int64_t, int>, TrainRun> cache;
  auto key = std::make_tuple(c.tie, spec.gas, spec.world);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train_plain_libtorch(c, kSeed, spec)).first;
  return it->second;
}

void expect_equal_training(const Variant& v) {
  SCOPED_TRACE(describe(v));
  auto world = engine_world();
  TinyLlamaConfig c;
  c.tie = v.tie;
  TrainSpec spec;
  spec.world = world->size();
  spec.gas = v.gas;
  const TrainRun& want = reference(c, spec);

  Config config = libtorch_test_config(v.stage, spec);
  RankTempDir swap_dir;
  config.zero.offload_optimizer.device = v.offload_optimizer;
  if (v.offload_optimizer == OffloadDevice::nvme) config.zero.offload_optimizer.nvme_path = swap_dir.path();
  Engine engine(resolved_for(config, *world), world, cpu_device());
  libtorch::ShardedModel sharded(engine, make_tiny_llama(c, kSeed), wrap_options(c, v.checkpoint));
  sharded.materialize();
  const TrainRun got = train_sharded(sharded, c, spec);

  ASSERT_NO_FATAL_FAILURE(expect_same_steps(got, want));
  std::string worst;
  // Training moved the weights far beyond the tolerance, so agreeing within it says something.
  TrainSpec untrained = spec;
  untrained.steps = 0;
  EXPECT_GT(max_relative_error(train_plain_libtorch(c, kSeed, untrained).params, want.params, &worst), 100 * kTolerance);
  const double err = max_relative_error(got.params, want.params, &worst);
  EXPECT_LE(err, kTolerance) << "largest weight difference at " << worst;
  ::testing::Test::RecordProperty("max_relative_error " + describe(v), ::testing::PrintToString(err));
}

TEST(LibtorchEquivalence, StagesZeroToThree) {
  for (int stage = 0; stage <= 3; ++stage) expect_equal_training({stage, false, 1, false});
}

TEST(LibtorchEquivalence, ActivationCheckpointing) {
  for (int stage = 1; stage <= 3; ++stage) expect_equal_training({stage, true, 1, false});
}

TEST(LibtorchEquivalence, GradientAccumulation) {
  for (int stage = 1; stage <= 3; ++stage) {
    expect_equal_training({stage, false, 2, false});
    expect_equal_training({stage, true, 2, false});
  }
}

TEST(LibtorchEquivalence, OptimizerOffload) {
  expect_equal_training({3, false, 2, false, OffloadDevice::cpu});
  expect_equal_training({3, true, 1, false, OffloadDevice::nvme});
  expect_equal_training({2, false, 1, false, OffloadDevice::nvme});
}

TEST(LibtorchEquivalence, TiedEmbedding) {
  expect_equal_training({3, false, 1, true});
  expect_equal_training({3, true, 2, true});
  expect_equal_training({1, false, 2, true});
}

// Stage 3: watched from inside the blocks' forward and backward, the parameters at full size are exactly the
// block's own and the root's; between micro-steps none is.
TEST(LibtorchResidency, ParametersAreFullOnlyInsideTheirUnit) {
  auto world = engine_world();
  TinyLlamaConfig c;
  TrainSpec spec;
  spec.world = world->size();
  spec.gas = 2;
  Engine engine(resolved_for(libtorch_test_config(3, spec), *world), world, cpu_device());
  libtorch::ShardedModel sharded(engine, make_tiny_llama(c, kSeed), wrap_options(c, false));
  std::set<std::string> root_names;
  for (const auto& item : sharded.module()->named_parameters()) {
    if (sharded.unit_of(item.key()) == *engine.find_unit("root")) root_names.insert(item.key());
  }
  EXPECT_EQ(root_names, (std::set<std::string>{"pos", "norm.weight"}));
  sharded.materialize();
  EXPECT_EQ(sharded.residency().full, 0);
  EXPECT_EQ(sharded.residency().storage_bytes, 0);

  int64_t observations = 0, model_bytes = 0, peak_full_bytes = 0;
  set_block_observer([&](int layer, bool backward) {
    ++observations;
    const std::string prefix = "blocks." + std::to_string(layer) + ".";
    int64_t full_bytes = 0;
    for (const auto& item : sharded.module()->named_parameters()) {
      const at::Tensor& t = item.value();
      const bool mine = item.key().rfind(prefix, 0) == 0 || root_names.count(item.key());
      if (mine) {
        EXPECT_GT(t.numel(), 0) << item.key() << (backward ? " in backward" : " in forward") << " of block " << layer;
      } else {
        EXPECT_EQ(t.numel(), 0) << item.key() << (backward ? " in backward" : " in forward") << " of block " << layer;
        EXPECT_EQ(t.storage().nbytes(), 0u) << item.key();
      }
      full_bytes += static_cast<int64_t>(t.numel() * t.element_size());
    }
    peak_full_bytes = std::max(peak_full_bytes, full_bytes);
  });
  for (int64_t step = 0; step < 2; ++step) {
    for (int64_t k = 0; k < spec.gas; ++k) {
      at::Tensor logits = tiny_llama_logits(sharded.module(), token_batch(c, spec, step, k * spec.world + engine.rank()).slice(1, 0, c.seq));
      EXPECT_EQ(sharded.residency().full, 0) << "after the forward";
      sharded.backward(logits.pow(2).mean());
      EXPECT_EQ(sharded.residency().full, 0) << "after the backward";
      EXPECT_EQ(sharded.residency().storage_bytes, 0);
      sharded.step();
    }
  }
  set_block_observer(nullptr);
  EXPECT_EQ(observations, 2 * spec.gas * c.layers * 2);  // forward and backward of every block in every micro-step
  for (const auto& item : sharded.gather_state_dict()) model_bytes += item.value().numel() * 4;
  EXPECT_GT(peak_full_bytes, 0);
  EXPECT_LT(peak_full_bytes * 2, model_bytes);  // one block and the root at a time, not the model
  ::testing::Test::RecordProperty("peak_full_parameter_bytes", ::testing::PrintToString(peak_full_bytes));
  ::testing::Test::RecordProperty("model_parameter_bytes", ::testing::PrintToString(model_bytes));
}

}  // namespace
}  // namespace zero3::testing

// SyncBatchNorm (zero3/libtorch/sync_batch_norm.hpp) on 2 and 3 ranks, each rank with different data and a different
// number of rows (rank r holds r + 2), against torch's batch norm over the concatenated batch in one process:
//  - the functional form on (N, C), (N, C, L) and (N, C, H, W) inputs: every rank's outputs and input gradients equal
//    the reference's rows, the ranks' weight and bias gradients add up to the reference's, the running statistics
//    equal the reference's and are bit for bit the same on every rank;
//  - the module in a model trained through the adapter (conv blocks with SyncBatchNorm inside units, one on the
//    pooled features in the root, the second block checkpointed or not, stages 1 and 3) against the same model with
//    torch's BatchNorm2d/BatchNorm1d trained by plain libtorch with AdamW on the whole global batch: every step's loss,
//    the final weights and the running statistics; and the running statistics are the same on every rank after each
//    backward, before step() synchronizes the buffers;
//  - its errors.
// zero3-test-ranks: 2 3
#include <gtest/gtest.h>

#include <ATen/ops/batch_norm.h>
#include <torch/nn/functional/loss.h>

#include <optional>
#include <string>
#include <vector>

#include "support/bn_conv_net.hpp"
#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/libtorch/sync_batch_norm.hpp"

namespace zero3::testing {
namespace {

constexpr uint64_t kSeed = 4321;

int64_t rows_of(int rank) { return rank + 2; }

int64_t first_row(int rank) {
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += rows_of(r);
  return first;
}

at::Tensor rows_of_rank(const at::Tensor& global, int rank) {
  return global.slice(0, first_row(rank), first_row(rank) + rows_of(rank));
}

// The largest difference relative to the largest magnitude of `want`.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() / scale;
}

at::Tensor all_reduced(Engine& engine, const at::Tensor& t, ReduceOp op) {
  at::Tensor f = t.detach().to(at::kCPU, at::kFloat).contiguous().clone();
  engine.all_reduce_host(f.data_ptr<float>(), static_cast<size_t>(f.numel()), op);
  return f;
}

// The same bits on every rank: the maximum over the ranks equals the minimum (the maximum of the negatives).
void expect_same_on_every_rank(Engine& engine, const at::Tensor& t, const std::string& what) {
  const at::Tensor high = all_reduced(engine, t, ReduceOp::max);
  const at::Tensor low = -all_reduced(engine, -t.to(at::kFloat), ReduceOp::max);
  EXPECT_TRUE(high.equal(low)) << what << " differs between the ranks";
}

TEST(SyncBatchNorm, FunctionalEqualsBatchNormOverTheConcatenatedBatch) {
  auto world = engine_world();
  TrainSpec spec;
  spec.world = world->size();
  Engine engine(resolved_for(libtorch_test_config(1, spec), *world), world, cpu_device());
  const int rank = engine.rank();
  const int64_t rows = first_row(engine.world_size());
  for (const std::vector<int64_t>& tail : std::vector<std::vector<int64_t>>{{3}, {3, 5}, {2, 3, 3}}) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), tail.begin(), tail.end());
    SCOPED_TRACE("global input " + c10::str(at::IntArrayRef(shape)));
    const int64_t channels = tail[0];
    torch::manual_seed(21);
    const at::Tensor global = torch::randn(shape) * 3 + 1.5;  // a mean far from 0: the variance's cancellation shows
    const at::Tensor upstream = torch::randn(shape);
    const at::Tensor weight0 = torch::randn({channels}) * 0.5 + 1, bias0 = torch::randn({channels});

    at::Tensor x = rows_of_rank(global, rank).clone().requires_grad_(true);
    at::Tensor w = weight0.clone().requires_grad_(true), b = bias0.clone().requires_grad_(true);
    at::Tensor mean = torch::zeros({channels}), var = torch::ones({channels});
    const at::Tensor y = libtorch::sync_batch_norm(engine, x, w, b, mean, var, /*training=*/true, 0.1, 1e-5);
    (y * rows_of_rank(upstream, rank)).sum().backward();

    at::Tensor xr = global.clone().requires_grad_(true);
    at::Tensor wr = weight0.clone().requires_grad_(true), br = bias0.clone().requires_grad_(true);
    at::Tensor mean_r = torch::zeros({channels}), var_r = torch::ones({channels});
    const at::Tensor yr = at::batch_norm(xr, wr, br, mean_r, var_r, /*training=*/true, 0.1, 1e-5, false);
    (yr * upstream).sum().backward();

    EXPECT_LE(relative_error(y, rows_of_rank(yr, rank)), 1e-5) << "output";
    EXPECT_LE(relative_error(x.grad(), rows_of_rank(xr.grad(), rank)), 1e-5) << "input gradient";
    EXPECT_LE(relative_error(all_reduced(engine, w.grad(), ReduceOp::sum), wr.grad()), 1e-5) << "weight gradient";
    EXPECT_LE(relative_error(all_reduced(engine, b.grad(), ReduceOp::sum), br.grad()), 1e-5) << "bias gradient";
    EXPECT_LE(relative_error(mean, mean_r), 1e-5) << "running_mean";
    EXPECT_LE(relative_error(var, var_r), 1e-5) << "running_var";
    expect_same_on_every_rank(engine, mean, "running_mean");
    expect_same_on_every_rank(engine, var, "running_var");
    // The check has teeth: the rank's own batch statistics give other outputs.
    at::Tensor local_mean = torch::zeros({channels}), local_var = torch::ones({channels});
    const at::Tensor local =
        at::batch_norm(rows_of_rank(global, rank), weight0, bias0, local_mean, local_var, true, 0.1, 1e-5, false);
    EXPECT_GT(relative_error(local, rows_of_rank(yr, rank)), 1e-2);
  }
}

struct ModelVariant {
  int stage;
  bool checkpoint;
  std::optional<double> momentum;
};

// The mean over the ranks of each rank's mean cross entropy: the loss the engine's averaged gradients are of.
at::Tensor mean_of_rank_losses(const at::Tensor& logits, const at::Tensor& labels, int world) {
  at::Tensor total = torch::zeros({});
  for (int r = 0; r < world; ++r) {
    total = total + torch::nn::functional::cross_entropy(rows_of_rank(logits, r), rows_of_rank(labels, r));
  }
  return total / world;
}

void expect_trains_like_batch_norm_over_the_global_batch(const ModelVariant& v) {
  SCOPED_TRACE("stage " + std::to_string(v.stage) + (v.checkpoint ? ", block2 checkpointed" : "") +
               (v.momentum ? "" : ", cumulative average"));
  auto world = engine_world();
  TrainSpec spec;
  spec.world = world->size();
  spec.steps = 3;
  BnConvNetConfig reference_config;
  reference_config.momentum = v.momentum;
  const int64_t rows = first_row(spec.world);
  const BnConvNetRun want = train_bn_conv_net_plain(reference_config, kSeed, spec, rows,
                                                    [&](const at::Tensor& logits, const at::Tensor& labels) {
                                                      return mean_of_rank_losses(logits, labels, spec.world);
                                                    });

  BnConvNetConfig config = reference_config;
  config.sync_batch_norm = true;
  Engine engine(resolved_for(libtorch_test_config(v.stage, spec), *world), world, cpu_device());
  libtorch::WrapOptions options;
  options.units = bn_conv_net_units();
  if (v.checkpoint) options.checkpoint = {"block2"};
  libtorch::ShardedModel sharded(engine, make_bn_conv_net(config, kSeed), options);
  sharded.materialize();
  const int rank = engine.rank();
  BnConvNetRun got;
  for (int64_t step = 0; step < spec.steps; ++step) {
    auto [images, labels] = bn_conv_net_batch(config, rows, step);
    at::Tensor loss = torch::nn::functional::cross_entropy(
        bn_conv_net_logits(sharded.module(), rows_of_rank(images, rank)), rows_of_rank(labels, rank));
    sharded.backward(loss);
    for (const auto& [name, buffer] : buffers_on_cpu(*sharded.module())) {
      expect_same_on_every_rank(engine, buffer, name + " after the backward of step " + std::to_string(step));
    }
    sharded.step();
    float value = loss.item<float>();
    engine.all_reduce_host(&value, 1, ReduceOp::avg);
    got.losses.push_back(value);
  }
  got.params = to_param_map(sharded.gather_state_dict());
  got.buffers = buffers_on_cpu(*sharded.module());

  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::fabs(want.losses[s])) << "step " << s;
  }
  std::string worst;
  EXPECT_LE(max_relative_error(got.params, want.params, &worst), 1e-4) << "largest weight difference at " << worst;
  ASSERT_EQ(got.buffers.size(), want.buffers.size());
  for (const auto& [name, buffer] : want.buffers) {
    ASSERT_TRUE(got.buffers.count(name)) << name;
    if (buffer.is_floating_point()) {
      EXPECT_LE(relative_error(got.buffers[name], buffer), 1e-4) << name;
    } else {
      EXPECT_TRUE(got.buffers[name].equal(buffer)) << name;
    }
  }
}

TEST(SyncBatchNorm, ModuleTrainsLikeBatchNormOverTheGlobalBatch) {
  expect_trains_like_batch_norm_over_the_global_batch({3, false, 0.1});
  expect_trains_like_batch_norm_over_the_global_batch({3, true, 0.1});
  expect_trains_like_batch_norm_over_the_global_batch({1, false, std::nullopt});
}

TEST(SyncBatchNorm, Errors) {
  auto world = engine_world();
  TrainSpec spec;
  spec.world = world->size();
  Engine engine(resolved_for(libtorch_test_config(1, spec), *world), world, cpu_device());
  const at::Tensor weight = torch::ones({3}), bias = torch::zeros({3}), mean = torch::zeros({3}),
                   var = torch::ones({3});
  try {
    libtorch::sync_batch_norm(engine, torch::randn({4, 2, 5}), weight, bias, mean, var, true, 0.1, 1e-5);
    ADD_FAILURE() << "an input with 2 channels for 3 features was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the input has 2 channels"), std::string::npos) << e.what();
  }
  // One value per channel over all ranks: only rank 0 has a row (every rank reaches the same verdict).
  try {
    libtorch::sync_batch_norm(engine, torch::randn({engine.rank() == 0 ? 1 : 0, 3}), weight, bias, mean, var, true, 0.1,
                              1e-5);
    ADD_FAILURE() << "one value per channel over all ranks was accepted in training";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero3::testing

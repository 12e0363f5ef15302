// The model's buffers under the adapter (BatchNorm's running statistics): the same on every rank after every step
// (rank 0's with BufferSync::broadcast, the ranks' mean with BufferSync::average), updated once per forward by a
// checkpointed unit (not again by its recomputation), saved by 3 ranks and restored on 2 and 1 ranks, and exported by
// consolidation and save_16bit_model under the module's names in their own types.
// zero3-test-ranks: 3
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <map>
#include <set>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

using libtorch::BufferSync;
using libtorch::ShardedModel;
using libtorch::WrapOptions;

constexpr int64_t kWidth = 12, kIn = 5, kClasses = 3, kBatch = 8;

struct BnBlockImpl : torch::nn::Module {
  BnBlockImpl()
      : fc(register_module("fc", torch::nn::Linear(kWidth, kWidth))),
        bn(register_module("bn", torch::nn::BatchNorm1d(kWidth))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::relu(bn(fc(x))); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(BnBlock);

struct BnNetImpl : torch::nn::Module {
  BnNetImpl()
      : stem(register_module("stem", torch::nn::Linear(kIn, kWidth))),
        block0(register_module("block0", BnBlock())),
        block1(register_module("block1", BnBlock())),
        head(register_module("head", torch::nn::Linear(kWidth, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = zero3::libtorch::call(stem, x);
    h = zero3::libtorch::call(block0, h);
    h = zero3::libtorch::call(block1, h);
    return zero3::libtorch::call(head, h);
  }
  torch::nn::Linear stem;
  BnBlock block0, block1;
  torch::nn::Linear head;
};
TORCH_MODULE(BnNet);

const std::vector<std::string> kUnits = {"stem", "block0", "block1", "head"};

struct TrainedNet {
  std::unique_ptr<Engine> engine;
  BnNet net{nullptr};
  std::unique_ptr<ShardedModel> sharded;
};

TrainedNet wrapped(const std::shared_ptr<Communicator>& comm, int stage, WrapOptions options, uint64_t seed = 1) {
  TrainSpec spec;
  spec.world = comm->size();
  TrainedNet r;
  r.engine = std::make_unique<Engine>(resolved_for(libtorch_test_config(stage, spec), *comm), comm, cpu_device());
  torch::manual_seed(seed);
  r.net = BnNet();
  options.units = kUnits;
  r.sharded = std::make_unique<ShardedModel>(*r.engine, r.net.ptr(), options);
  r.sharded->materialize();
  return r;
}

// One micro-step on this rank's batch of step `step` (each rank its own data, so its own statistics).
void forward_backward(TrainedNet& r, int64_t step) {
  torch::manual_seed(1000 + static_cast<uint64_t>(step) * 16 + static_cast<uint64_t>(r.engine->rank()));
  const at::Tensor x = torch::randn({kBatch, kIn}) * (1.0 + r.engine->rank()) + r.engine->rank();
  const at::Tensor y = torch::randint(kClasses, {kBatch});
  r.sharded->backward(torch::nn::functional::cross_entropy(zero3::libtorch::call(r.net, x), y));
}

std::map<std::string, at::Tensor> buffers_of(const BnNet& net) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : net->named_buffers()) out[item.key()] = item.value().clone();
  return out;
}

// The first buffer whose values differ between the ranks ("" when none): each value against its maximum and
// minimum over the ranks.
std::string differing_buffer(Engine& engine, const BnNet& net) {
  for (const auto& [name, t] : buffers_of(net)) {
    const at::Tensor f = t.to(at::kFloat).contiguous().view({-1});
    std::vector<float> high(f.data_ptr<float>(), f.data_ptr<float>() + f.numel()), low(high);
    for (float& v : low) v = -v;
    engine.all_reduce_host(high.data(), high.size(), ReduceOp::max);
    engine.all_reduce_host(low.data(), low.size(), ReduceOp::max);
    for (size_t i = 0; i < high.size(); ++i) {
      if (high[i] != -low[i]) return name;
    }
  }
  return "";
}

std::string first_difference(const std::map<std::string, at::Tensor>& got,
                             const std::map<std::string, at::Tensor>& want) {
  if (got.size() != want.size()) return "the buffer count";
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    if (it == got.end() || !it->second.equal(t)) return name;
  }
  return "";
}

TEST(LibtorchBuffers, BroadcastMakesEveryRankRank0s) {
  auto world = engine_world();
  TrainedNet r = wrapped(world, 3, WrapOptions{.buffer_sync = BufferSync::broadcast});
  EXPECT_EQ(
      r.sharded->buffer_names(),
      (std::vector<std::string>{"block0.bn.running_mean", "block0.bn.running_var", "block0.bn.num_batches_tracked",
                                "block1.bn.running_mean", "block1.bn.running_var", "block1.bn.num_batches_tracked"}));
  for (int64_t step = 0; step < 3; ++step) {
    forward_backward(r, step);
    const auto before = buffers_of(r.net);  // this rank's own statistics
    if (world->size() > 1) {
      EXPECT_NE(differing_buffer(*r.engine, r.net), "") << "the ranks' batches should differ";
    }
    r.sharded->step();
    EXPECT_EQ(differing_buffer(*r.engine, r.net), "") << "after step " << step;
    if (world->rank() == 0) {
      EXPECT_EQ(first_difference(buffers_of(r.net), before), "") << "rank 0's own statistics";
    }
  }
  EXPECT_EQ(r.net->block1->bn->num_batches_tracked.item<int64_t>(), 3);
  EXPECT_GT(r.net->block0->bn->running_mean.abs().sum().item<double>(), 0.0);
}

TEST(LibtorchBuffers, AverageMakesEveryRankTheMean) {
  auto world = engine_world();
  TrainedNet r = wrapped(world, 2, WrapOptions{.buffer_sync = BufferSync::average});
  for (int64_t step = 0; step < 2; ++step) {
    forward_backward(r, step);
    auto mean = buffers_of(r.net);
    for (auto& [name, t] : mean) {
      if (!at::isFloatingType(t.scalar_type())) continue;
      std::vector<float> v(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      r.engine->all_reduce_host(v.data(), v.size(), ReduceOp::avg);
      t = torch::tensor(v).view(t.sizes());
    }
    r.sharded->step();
    EXPECT_EQ(differing_buffer(*r.engine, r.net), "") << "after step " << step;
    for (const auto& [name, t] : buffers_of(r.net)) {
      if (at::isFloatingType(t.scalar_type())) {
        EXPECT_TRUE(t.allclose(mean[name], 1e-6, 1e-7)) << name << " is not the mean over the ranks";
      } else {
        EXPECT_EQ(t.item<int64_t>(), step + 1) << name;
      }
    }
  }
}

TEST(LibtorchBuffers, CheckpointedRecomputationDoesNotUpdateThemAgain) {
  auto world = engine_world();
  std::map<std::string, at::Tensor> plain, checkpointed;
  for (const bool checkpoint : {false, true}) {
    WrapOptions o;
    if (checkpoint) o.checkpoint = {"block0", "block1"};
    TrainedNet r = wrapped(world, 3, o);
    for (int64_t step = 0; step < 2; ++step) {
      forward_backward(r, step);
      r.sharded->step();
    }
    (checkpoint ? checkpointed : plain) = buffers_of(r.net);
  }
  EXPECT_EQ(checkpointed.at("block0.bn.num_batches_tracked").item<int64_t>(), 2);
  for (const auto& [name, t] : plain) {
    EXPECT_TRUE(checkpointed.at(name).allclose(t, 1e-6, 1e-7)) << name << ": " << checkpointed.at(name) << " vs " << t;
  }
}

std::map<std::string, at::Tensor> read_export(const std::filesystem::path& dir, const std::vector<std::string>& names) {
  safetensors::ShardedSafetensorsReader reader(dir);
  std::map<std::string, at::Tensor> out;
  for (const std::string& name : names) {
    const safetensors::TensorInfo& info = reader.tensor(name);
    const at::ScalarType type = info.dtype == safetensors::Dtype::i64 ? at::kLong : at::kFloat;
    EXPECT_TRUE(info.dtype == safetensors::Dtype::i64 || info.dtype == safetensors::Dtype::f32) << name;
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
    reader.read_range(name, 0, info.numel(), t.data_ptr());
    out[name] = t;
  }
  return out;
}

TEST(LibtorchBuffers, CheckpointsRestoreThemOnOtherWorldSizesAndExportsWriteThem) {
  auto world = engine_world();
  if (world->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  SharedTempDir dir(*world, "zero3-libtorch-buffers");
  std::map<std::string, at::Tensor> saved;
  std::set<std::string> all_names;  // the parameters' and the buffers'
  ExportedModel exported16;
  ExportOptions export_options;
  {
    TrainedNet run = wrapped(world, 3, WrapOptions{});
    for (int64_t step = 0; step < 2; ++step) {
      forward_backward(run, step);
      run.sharded->step();
    }
    saved = buffers_of(run.net);
    for (const auto& item : run.net->named_parameters()) all_names.insert(item.key());
    for (const std::string& name : run.sharded->buffer_names()) all_names.insert(name);
    save_checkpoint(*run.engine, dir.path(), "step2");
    export_options = run.sharded->export_options();
    ExportOptions o = export_options;
    o.dtype = DType::f32;
    exported16 = save_16bit_model(*run.engine, dir.path() / "hf16", o);
  }

  for (const int ranks : {2, 1}) {
    SCOPED_TRACE("loaded by " + std::to_string(ranks) + " ranks");
    std::unique_ptr<Communicator> sub = world->split(world->rank() < ranks ? 0 : -1, world->rank());
    if (sub) {
      std::shared_ptr<Communicator> comm(std::move(sub));
      TrainedNet r = wrapped(comm, ranks == 1 ? 2 : 3, WrapOptions{}, /*seed=*/9);
      {  // other statistics than the checkpoint's: the load must replace them
        at::NoGradGuard no_grad;
        r.net->block0->bn->running_mean.fill_(5);
        r.net->block1->bn->num_batches_tracked.fill_(40);
      }
      load_checkpoint(*r.engine, dir.path());
      EXPECT_EQ(first_difference(buffers_of(r.net), saved), "");
      forward_backward(r, 2);
      r.sharded->step();
      EXPECT_EQ(r.net->block0->bn->num_batches_tracked.item<int64_t>(), 3);
      EXPECT_EQ(differing_buffer(*r.engine, r.net), "");
    }
    world->barrier();
  }

  std::vector<std::string> names;
  for (const auto& [name, t] : saved) names.push_back(name);
  if (world->rank() == 0) {
    const ExportedModel consolidated = consolidate_checkpoint(dir.path(), "step2", dir.path() / "hf", export_options);
    EXPECT_EQ(consolidated.tensors, static_cast<int64_t>(all_names.size()));
    EXPECT_EQ(exported16.tensors, static_cast<int64_t>(all_names.size()));
    EXPECT_EQ(safetensors::ShardedSafetensorsReader(dir.path() / "hf").names(),
              std::vector<std::string>(all_names.begin(), all_names.end()));
    EXPECT_EQ(first_difference(read_export(dir.path() / "hf", names), saved), "") << "consolidated";
    EXPECT_EQ(first_difference(read_export(dir.path() / "hf16", names), saved), "") << "save_16bit_model";
  }
  world->barrier();
}

}  // namespace
}  // namespace zero3::testing

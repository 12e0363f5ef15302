// The libtorch adapter on the CUDA device. Labels libtorch and gpu; exit code 77 (skipped) without a CUDA build of
// libtorch or without a CUDA device, as the tests/gpu programs do.
//
// Without a CUDA build of libtorch (Debian's libtorch-dev) the program first checks what such a machine must see: a
// ShardedModel on an engine on a cuda device (the stream-path test device, which reports itself as cuda) throws
// Unsupported naming the device and saying that libtorch was built without CUDA. A wrong answer is a failure (exit 1).
//
// With a GPU, on one rank (NCCL's world of one), against plain libtorch on the cpu:
//  - the tiny Llama at stages 2 and 3, with checkpointed blocks and gradient accumulation, on torch's default stream
//    and on a stream of torch's pool (torch's kernels and the engine's then run on different streams, ordered only
//    by the adapter's events): every step's loss and gradient norm within 1e-5, the final weights within 1e-4 of
//    each tensor's scale (the bounds of the cpu equivalence tests); the engine's device memory all returned;
//  - the CNN with torch's BatchNorm and with SyncBatchNorm (its buffers in device memory): the same, and its
//    running statistics within 1e-4;
//  - the device buffers through a checkpoint: saved, overwritten, loaded back bit for bit.
// zero3-test-labels: gpu
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/functional/loss.h>
#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "support/bn_conv_net.hpp"
#include "support/engine_world.hpp"
#include "support/expect_same_training.hpp"
#include "support/libtorch_training.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/build_config.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/comm.hpp"

namespace zero3::testing {
namespace {

namespace F = torch::nn::functional;

constexpr uint64_t kSeed = 1234;

[[noreturn]] void skip(const std::string& why) {
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

[[noreturn]] void fail(const std::string& why) {
  std::printf("FAILED: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(1);
}

const c10::impl::DeviceGuardImplInterface* torch_cuda() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return nullptr;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

// A libtorch without CUDA: the adapter refuses an engine on a cuda device, naming the device and the reason.
void check_refusal_without_torch_cuda() {
  StreamPathDevice device;
  CommOptions local;
  local.backend = "local";
  auto comm = std::make_shared<StreamPathComm>(std::shared_ptr<Communicator>(connect(local)), device);
  Engine engine(resolved_for(libtorch_test_config(3, TrainSpec{}), *comm), comm, device);
  const TinyLlamaConfig c;
  try {
    libtorch::WrapOptions options;
    options.units = tiny_llama_units(c);
    libtorch::ShardedModel sharded(engine, make_tiny_llama(c, kSeed), options);
    fail("a ShardedModel accepted an engine on a cuda device with a libtorch built without CUDA");
  } catch (const Unsupported& e) {
    const std::string m = e.what();
    if (m.find("was built without CUDA") == std::string::npos || m.find(device.name()) == std::string::npos) {
      fail("ShardedModel threw \"" + m + "\"; expected Unsupported naming '" + device.name() +
           "' and saying that libtorch was built without CUDA");
    }
  } catch (const std::exception& e) {
    fail(std::string("ShardedModel threw a ") + typeid(e).name() + " (" + e.what() + "), not Unsupported");
  }
}

class LibtorchCudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const c10::impl::DeviceGuardImplInterface* cuda = torch_cuda();
    if (cuda == nullptr) {
      check_refusal_without_torch_cuda();
      skip("libtorch " TORCH_VERSION " was built without CUDA (checked: the adapter refuses a cuda engine by name)");
    }
#if !ZERO3_HAVE_CUDA || !ZERO3_HAVE_NCCL
    skip("this build of zero3 has no CUDA or no NCCL backend (an engine on a cuda device needs both)");
#endif
    if (cuda->deviceCount() == 0) skip("libtorch " TORCH_VERSION " sees no CUDA device");
  }
};

const ::testing::Environment* const kEnvironment = ::testing::AddGlobalTestEnvironment(new LibtorchCudaEnvironment);

const at::Device kCuda(at::kCUDA, 0);

// Torch's current CUDA stream is one of its pool's (not the engine's) while it lives, when asked for.
class TorchSideStream {
 public:
  explicit TorchSideStream(bool wanted) {
    if (wanted) guard_.emplace(torch_cuda()->getStreamFromGlobalPool(kCuda));
  }

 private:
  std::optional<c10::StreamGuard> guard_;
};

struct LlamaVariant {
  std::string name;
  int stage;
  bool checkpoint;
  int64_t gas;
  bool side_stream;
};

TrainRun train_tiny_llama_on_cuda(libtorch::ShardedModel& sharded, const TinyLlamaConfig& c, const TrainSpec& spec) {
  Engine& engine = sharded.engine();
  TrainRun run;
  for (int64_t step = 0; step < spec.steps; ++step) {
    double loss_sum = 0;
    for (int64_t k = 0; k < engine.gradient_accumulation_steps(); ++k) {
      const at::Tensor batch = token_batch(c, spec, step, k).to(kCuda);
      const at::Tensor logits = tiny_llama_logits(sharded.module(), batch.slice(1, 0, c.seq));
      const at::Tensor loss =
          F::cross_entropy(logits.reshape({-1, c.vocab}).to(at::kFloat), batch.slice(1, 1, c.seq + 1).reshape({-1}));
      sharded.backward(loss);
      const StepResult r = sharded.step();
      if (r.boundary) run.grad_norms.push_back(r.grad_norm);
      loss_sum += loss.item<double>();
    }
    run.losses.push_back(loss_sum / static_cast<double>(engine.gradient_accumulation_steps()));
  }
  run.params = to_param_map(sharded.gather_state_dict());
  return run;
}

TEST(LibtorchCuda, TinyLlamaOnCudaEqualsPlainLibtorchOnCpu) {
  const LlamaVariant variants[] = {
      {"stage3", 3, false, 1, false},
      {"stage3_checkpointed_accumulation", 3, true, 2, false},
      {"stage2_accumulation_torch_side_stream", 2, false, 2, true},
      {"stage3_checkpointed_torch_side_stream", 3, true, 1, true},
  };
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  const TinyLlamaConfig c;
  for (const LlamaVariant& v : variants) {
    SCOPED_TRACE(v.name);
    TrainSpec spec;
    spec.gas = v.gas;
    const TrainRun want = train_plain_libtorch(c, kSeed, spec);
    {
      TorchSideStream stream(v.side_stream);
      Engine engine(resolved_for(libtorch_test_config(v.stage, spec), *comm), comm, *device);
      std::shared_ptr<torch::nn::Module> model = make_tiny_llama(c, kSeed);
      model->to(kCuda);
      libtorch::WrapOptions options;
      options.units = tiny_llama_units(c);
      if (v.checkpoint) {
        for (const std::string& u : options.units) {
          if (u.rfind("blocks.", 0) == 0) options.checkpoint.push_back(u);
        }
      }
      libtorch::ShardedModel sharded(engine, model, options);
      sharded.materialize();
      const TrainRun got = train_tiny_llama_on_cuda(sharded, c, spec);
      ASSERT_NO_FATAL_FAILURE(expect_same_steps(got, want));
      std::string worst;
      EXPECT_LE(max_relative_error(got.params, want.params, &worst), 1e-4) << "largest difference at " << worst;
    }
    EXPECT_EQ(device->bytes_in_use(), 0) << "the engine left device memory behind";
  }
}

// Trains the CNN through the adapter on cuda: each step's whole batch on the one rank.
BnConvNetRun train_bn_conv_net_on_cuda(libtorch::ShardedModel& sharded, const BnConvNetConfig& c, const TrainSpec& spec,
                                       int64_t rows) {
  BnConvNetRun run;
  for (int64_t step = 0; step < spec.steps; ++step) {
    auto [images, labels] = bn_conv_net_batch(c, rows, step);
    const at::Tensor loss = F::cross_entropy(bn_conv_net_logits(sharded.module(), images.to(kCuda)), labels.to(kCuda));
    sharded.backward(loss);
    sharded.step();
    run.losses.push_back(loss.item<double>());
  }
  run.params = to_param_map(sharded.gather_state_dict());
  run.buffers = buffers_on_cpu(*sharded.module());
  return run;
}

TEST(LibtorchCuda, BatchNormCnnOnCudaEqualsPlainLibtorchOnCpu) {
  at::globalContext().setAllowTF32CuDNN(false);  // fp32 convolutions, as the cpu reference computes them
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  TrainSpec spec;
  spec.steps = 4;
  const int64_t rows = 6;
  const BnConvNetRun want = train_bn_conv_net_plain(
      BnConvNetConfig{}, kSeed, spec, rows,
      [](const at::Tensor& logits, const at::Tensor& labels) { return F::cross_entropy(logits, labels); });
  for (const bool sync : {false, true}) {
    SCOPED_TRACE(sync ? "SyncBatchNorm, block2 checkpointed" : "torch's BatchNorm");
    {
      TorchSideStream stream(sync);
      BnConvNetConfig c;
      c.sync_batch_norm = sync;
      Engine engine(resolved_for(libtorch_test_config(3, spec), *comm), comm, *device);
      std::shared_ptr<torch::nn::Module> model = make_bn_conv_net(c, kSeed);
      model->to(kCuda);
      libtorch::WrapOptions options;
      options.units = bn_conv_net_units();
      if (sync) options.checkpoint = {"block2"};
      libtorch::ShardedModel sharded(engine, model, options);
      sharded.materialize();
      BnConvNetRun got = train_bn_conv_net_on_cuda(sharded, c, spec, rows);
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t s = 0; s < want.losses.size(); ++s) {
        EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::fabs(want.losses[s])) << "step " << s;
      }
      std::string worst;
      EXPECT_LE(max_relative_error(got.params, want.params, &worst), 1e-4) << "largest difference at " << worst;
      ASSERT_EQ(got.buffers.size(), want.buffers.size());
      for (const auto& [name, buffer] : want.buffers) {
        ASSERT_TRUE(got.buffers.count(name)) << name;
        const at::Tensor diff = (got.buffers[name].to(at::kDouble) - buffer.to(at::kDouble)).abs().max();
        EXPECT_LE(diff.item<double>(), 1e-4 * std::max(1.0, buffer.to(at::kDouble).abs().max().item<double>())) << name;
      }
    }
    EXPECT_EQ(device->bytes_in_use(), 0) << "the engine left device memory behind";
  }
}

TEST(LibtorchCuda, DeviceBuffersGoThroughACheckpoint) {
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  TrainSpec spec;
  spec.steps = 2;
  const BnConvNetConfig c;
  Engine engine(resolved_for(libtorch_test_config(3, spec), *comm), comm, *device);
  std::shared_ptr<torch::nn::Module> model = make_bn_conv_net(c, kSeed);
  model->to(kCuda);
  libtorch::WrapOptions options;
  options.units = bn_conv_net_units();
  libtorch::ShardedModel sharded(engine, model, options);
  sharded.materialize();
  train_bn_conv_net_on_cuda(sharded, c, spec, 6);
  const std::map<std::string, at::Tensor> saved = buffers_on_cpu(*model);
  RankTempDir dir;
  save_checkpoint(engine, dir.path(), "trained");
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& b : model->buffers()) b.fill_(7);
  }
  load_checkpoint(engine, dir.path(), "trained");
  sharded.sync_buffers();  // the loaded values reach the device buffers here, or at the model's next call
  for (const auto& [name, now] : buffers_on_cpu(*model)) {
    EXPECT_TRUE(now.equal(saved.at(name))) << name << " was not restored";
    EXPECT_TRUE(model->named_buffers()[name].is_cuda()) << name;
  }
}

}  // namespace
}  // namespace zero3::testing

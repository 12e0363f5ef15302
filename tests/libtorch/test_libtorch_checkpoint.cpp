// Checkpoints of a torch::nn model trained through the adapter: saved by 3 ranks at stage 3, loaded into a freshly
// built model (other initial weights) on 2 ranks at stage 3 and on 1 rank at stage 2 (engines on sub-communicators of
// the 3-rank job). Right after the load the weights are bit for bit the saved ones; training then continues as the
// 3-rank run that never stopped (same global batches; within fp32 round-off, the reductions run in another order).
// Consolidated to safetensors, the tensors carry the module's own parameter names and the saved values, with the
// adapter's export options and with the default naming (what `zero3 ckpt consolidate` uses).
// zero3-test-ranks: 3
#include <gtest/gtest.h>

#include <set>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

constexpr int64_t kMicroBatches = 6;  // per optimizer step, divisible by 1, 2 and 3 ranks
constexpr int64_t kSaved = 2, kMore = 2;

TrainSpec spec_for(int world, int64_t steps) {
  TrainSpec s;
  s.world = world;
  s.gas = kMicroBatches / world;
  s.steps = steps;
  return s;
}

struct WrappedRun {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<libtorch::ShardedModel> sharded;
};

WrappedRun wrapped(const TinyLlamaConfig& c, int stage, const std::shared_ptr<Communicator>& comm, uint64_t seed) {
  WrappedRun r;
  r.engine = std::make_unique<Engine>(resolved_for(libtorch_test_config(stage, spec_for(comm->size(), 0)), *comm), comm,
                                      cpu_device());
  r.sharded = std::make_unique<libtorch::ShardedModel>(*r.engine, make_tiny_llama(c, seed),
                                                       libtorch::WrapOptions{.units = tiny_llama_units(c)});
  r.sharded->materialize();
  return r;
}

ParamMap read_safetensors(const std::filesystem::path& file) {
  safetensors::SafetensorsReader reader(file);
  ParamMap out;
  for (const safetensors::TensorInfo& t : reader.tensors()) {
    std::vector<float>& v = out[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    reader.read_as_f32(t.name, 0, t.numel(), v.data());
  }
  return out;
}

TEST(LibtorchCheckpoint, ResumesOnOtherWorldSizesAndConsolidatesByModuleNames) {
  auto world = engine_world();
  if (world->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  SharedTempDir dir(*world, "zero3-libtorch-ckpt");
  TinyLlamaConfig c;

  ParamMap want;
  {
    WrappedRun straight = wrapped(c, 3, world, 11);
    want = train_sharded(*straight.sharded, c, spec_for(3, kSaved + kMore)).params;
  }
  ParamMap saved;
  ExportOptions adapter_export;
  {
    WrappedRun run = wrapped(c, 3, world, 11);
    saved = train_sharded(*run.sharded, c, spec_for(3, kSaved)).params;
    save_checkpoint(*run.engine, dir.path(), "step2");
    adapter_export = run.sharded->export_options();
  }

  struct Target {
    int world;
    int stage;
  };
  for (const Target t : {Target{2, 3}, Target{1, 2}}) {
    SCOPED_TRACE("loaded by " + std::to_string(t.world) + " ranks at stage " + std::to_string(t.stage));
    std::unique_ptr<Communicator> sub = world->split(world->rank() < t.world ? 0 : -1, world->rank());
    if (sub) {
      std::shared_ptr<Communicator> comm(std::move(sub));
      WrappedRun run = wrapped(c, t.stage, comm, /*seed=*/12);  // other initial weights: the checkpoint must replace them
      const LoadedCheckpoint loaded = load_checkpoint(*run.engine, dir.path());
      EXPECT_TRUE(loaded.resharded);
      EXPECT_EQ(run.engine->global_steps(), kSaved);
      EXPECT_EQ(first_bit_difference(to_param_map(run.sharded->gather_state_dict()), saved), "");
      const ParamMap got = train_sharded(*run.sharded, c, spec_for(t.world, kMore), kSaved).params;
      std::string worst;
      EXPECT_LE(max_relative_error(got, want, &worst), 1e-4) << "largest difference at " << worst;
    }
    world->barrier();
  }

  if (world->rank() == 0) {
    std::set<std::string> module_names;
    for (const auto& item : make_tiny_llama(c, 11)->named_parameters()) module_names.insert(item.key());
    for (const bool adapter_options : {true, false}) {
      SCOPED_TRACE(adapter_options ? "ShardedModel::export_options()" : "default ExportOptions");
      const std::filesystem::path out = dir.path() / (adapter_options ? "hf-adapter" : "hf-default");
      const ExportedModel exported =
          consolidate_checkpoint(dir.path(), "step2", out, adapter_options ? adapter_export : ExportOptions{});
      ASSERT_EQ(exported.files.size(), 1u);
      const ParamMap tensors = read_safetensors(out / exported.files[0]);
      std::set<std::string> names;
      for (const auto& [name, values] : tensors) names.insert(name);
      EXPECT_EQ(names, module_names);
      EXPECT_EQ(first_bit_difference(tensors, saved), "");
    }
  }
  world->barrier();
}

}  // namespace
}  // namespace zero3::testing

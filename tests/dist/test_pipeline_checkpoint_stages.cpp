// Checkpoints of a pipelined run at the level of its stage engines (src/checkpoint/checkpoint_ranks.hpp): each
// pipeline rank holds an Engine over its stage's data-parallel group (Engine with a PipelineStageBinding, groups from
// pipeline::make_pipeline_groups), and the save and the load agree over the world. A chain of 8 layers of uneven
// widths, each layer one unit, trained with a gradient of its own (a function of the unit's weights and of the
// micro-batch's index, the same whichever layout computes it), so that every layout runs the same optimization:
//   - saved at 4 stages x 1 rank, it loads at 2 stages x 2 ranks, on one Engine over 4 ranks and over 2 ranks, with
//     the weights and the Adam state bit for bit the saved ones, and training goes on as the 4-stage run that never
//     stopped within fp32 round-off (another data-parallel size and another split of the gradient norm's sum change
//     the order of the reductions);
//   - a checkpoint of one Engine over 4 ranks loads at 4 stages, bit for bit;
//   - consolidation of the pipelined checkpoint holds every layer's weights, equal to the gathered model;
//   - bad input: a stage that declares a unit the checkpoint lacks, a unit of another shape, a checkpoint with a unit
//     no stage holds: every rank refuses it, naming the unit.
// zero3-test-ranks: 4
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_ranks.hpp"
#include "checkpoint/save_on_node.hpp"
#include "pipeline/pipeline_topology.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kLayers = 8;
constexpr int64_t kMicroBatches = 8;      // per optimizer step, over all data-parallel ranks
constexpr int64_t kSaved = 3, kMore = 3;  // optimizer steps before and after the checkpoint
constexpr double kTolerance = 1e-5;       // as the other fp32 resume tests: reductions in another order

int64_t width(int l) { return 5 + (l * 2) % 3; }  // layer l maps width(l) to width(l + 1) features
std::string layer_name(int l) { return "layers." + std::to_string(l); }

// One layout of the 4-rank job: `stages` pipeline stages over `ranks` ranks (stages == 0: one Engine, no pipeline).
struct Layout {
  int stages = 1;
  int ranks = 4;
  std::string describe() const {
    return stages == 0 ? "one Engine over " + std::to_string(ranks) + " ranks"
                       : std::to_string(stages) + " stages x " + std::to_string(ranks / stages) + " ranks";
  }
};

// This rank's part of a layout: its engine (null on ranks outside it) and, in a pipeline, its stage's groups.
struct StageRun {
  Layout layout;
  std::unique_ptr<Engine> engine;
  int stage = 0;
  int stages = 1;
  std::shared_ptr<Communicator> pipeline_group;
};

Config config_for(int zero_stage, const Layout& layout) {
  Config c = equivalence_config(zero_stage);
  const int stages = std::max(layout.stages, 1);
  c.pipeline.stages = stages;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = kMicroBatches / (layout.ranks / stages);
  c.train_batch_size = kMicroBatches;
  ResolveInputs in;
  in.world_size = layout.ranks;
  resolve(c, in);
  return c;
}

// Builds this rank's engine of `layout` over `world` (collective over the world), with layers [first, end) of its
// stage, `extra` added to the declared units when not null (to play a model of another shape).
StageRun make_run(const std::shared_ptr<Communicator>& world, const Layout& layout, int zero_stage,
                  const std::function<void(Engine&, int stage)>& declare = nullptr) {
  StageRun run;
  run.layout = layout;
  const Config config = config_for(zero_stage, layout);
  auto declare_layers = [&](Engine& e, int first, int end) {
    for (int l = first; l < end; ++l) {
      e.add_unit(layer_name(l), {{"w", {width(l + 1), width(l)}, ParamInit::normal(0.3)},
                                 {"b", {width(l + 1)}, ParamInit::uniform(-0.1, 0.1)}});
    }
  };
  if (layout.stages == 0) {
    std::shared_ptr<Communicator> comm = world;
    if (layout.ranks < world->size()) {
      std::unique_ptr<Communicator> sub = world->split(world->rank() < layout.ranks ? 0 : -1, world->rank());
      if (!sub) return run;
      comm = std::shared_ptr<Communicator>(std::move(sub));
    }
    run.engine = std::make_unique<Engine>(config, comm, cpu_device());
    if (declare) {
      declare(*run.engine, 0);
    } else {
      declare_layers(*run.engine, 0, kLayers);
    }
  } else {
    const pipeline::PipelineTopology topology =
        pipeline::make_pipeline_topology(detail::NodeLayout{world->size(), world->size()}, layout.stages);
    pipeline::PipelineGroups groups = pipeline::make_pipeline_groups(world, topology);
    run.stage = groups.stage;
    run.stages = layout.stages;
    run.pipeline_group = groups.pipeline.comm;
    run.engine =
        std::make_unique<Engine>(config, groups.data_parallel.comm, cpu_device(),
                                 PipelineStageBinding{groups.pipeline.comm, *config.gradient_accumulation_steps});
    if (declare) {
      declare(*run.engine, run.stage);
    } else {
      const int per_stage = kLayers / layout.stages;
      declare_layers(*run.engine, run.stage * per_stage, (run.stage + 1) * per_stage);
    }
  }
  run.engine->materialize();
  return run;
}

ckpt::CheckpointRanks ranks_of(StageRun& run, Communicator& world) {
  if (run.layout.stages == 0) return ckpt::engine_ranks(*run.engine);
  return ckpt::pipeline_ranks(*run.engine, world, run.stage, run.stages);
}

// Adds unit `l`'s gradient on micro-batch `data_index` to its gradient buffer: a pull toward a target that depends
// on the micro-batch, plus a weight-dependent term (so Adam's moments and clipping see a real trajectory).
void add_gradient(UnitScope& scope, int l, int64_t data_index) {
  const float* p = scope.flat_params().as<float>();
  float* g = scope.flat_grads().as<float>();
  const int64_t n = scope.flat_params().numel;
  for (int64_t i = 0; i < n; ++i) {
    const double target =
        std::sin(0.37 * static_cast<double>(i + 1) + 1.3 * l + 0.71 * static_cast<double>(data_index));
    g[i] += static_cast<float>(0.8 * (static_cast<double>(p[i]) - target) + 0.05 * static_cast<double>(data_index % 5));
  }
}

// Optimizer steps [first, first + steps): each of the engine's micro-steps runs its micro-batches through its units
// (forward scopes in order, backward scopes in reverse, as a pipeline stage would), then step().
void train(StageRun& run, int64_t first, int64_t steps) {
  if (!run.engine) return;
  Engine& e = *run.engine;
  const int64_t gas = e.gradient_accumulation_steps();
  // A pipeline stage's one micro-step holds all its micro-batches of the step; one Engine's holds one.
  const int64_t per_micro_step = *e.config().gradient_accumulation_steps / gas;
  for (int64_t step = first; step < first + steps; ++step) {
    for (int64_t micro = 0; micro < gas; ++micro) {
      for (int64_t k = 0; k < per_micro_step; ++k) {
        const int64_t batch = micro * per_micro_step + k;
        const int64_t data_index = batch_index(step, batch, gas * per_micro_step, e.rank(), e.world_size());
        for (size_t u = 0; u < e.num_units(); ++u) e.forward_scope(UnitId{static_cast<int32_t>(u)});
        for (size_t u = e.num_units(); u-- > 0;) {
          UnitScope s = e.backward_scope(UnitId{static_cast<int32_t>(u)});
          add_gradient(s, std::stoi(e.unit(s.unit()).name.substr(7)), data_index);
        }
      }
      e.step();
    }
  }
}

// The chain's units: names and sizes.
std::vector<std::pair<std::string, int64_t>> chain_units() {
  std::vector<std::pair<std::string, int64_t>> units;
  for (int l = 0; l < kLayers; ++l) units.emplace_back(layer_name(l), width(l + 1) * width(l) + width(l + 1));
  return units;
}

// The whole model's state on every rank of the world.
std::map<std::string, std::vector<float>> model_state(StageRun& run, Communicator& world) {
  return world_state(run.engine.get(), world, chain_units());
}

class PipelineCheckpointStages : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    world_ = engine_world();
    if (world_->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  }
  std::shared_ptr<Communicator> world_;
};

TEST_P(PipelineCheckpointStages, SavedAtFourStagesResumesAtTwoStagesAndWithoutAPipeline) {
  const int zero_stage = GetParam();
  SharedTempDir dir(*world_, "zero3-ckpt-pipe");
  const Layout saved_layout{4, 4};

  StageRun straight = make_run(world_, saved_layout, zero_stage);
  train(straight, 0, kSaved + kMore);
  const auto want = model_state(straight, *world_);

  std::map<std::string, std::vector<float>> saved_state;
  {
    StageRun run = make_run(world_, saved_layout, zero_stage);
    train(run, 0, kSaved);
    saved_state = model_state(run, *world_);
    const SavedCheckpoint saved =
        ckpt::save_checkpoint_on_node(ranks_of(run, *world_), dir.path(), "step3", {{"next_step", "3"}}, "node");
    EXPECT_EQ(saved.files, 4);
  }
  const CheckpointInfo info = verify_checkpoint(dir.path());
  EXPECT_EQ(info.pipeline_stages, 4);
  EXPECT_EQ(info.data_parallel_size(), 1);
  EXPECT_EQ(info.format_version, 2);
  ASSERT_EQ(info.units.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(info.units[static_cast<size_t>(l)].name, layer_name(l));
    EXPECT_EQ(info.units[static_cast<size_t>(l)].pipeline_stage, l / 2);
  }
  EXPECT_EQ(info.files[1].name, "stage-01-of-04-rank-00000-of-00001.safetensors");
  // The micro-batches run so far, whichever engine counts them.
  EXPECT_EQ(info.training_state.micro_steps, kSaved * kMicroBatches);
  EXPECT_EQ(info.training_state.global_steps, kSaved);

  for (const Layout target : {Layout{2, 4}, Layout{0, 4}, Layout{0, 2}, Layout{4, 4}}) {
    SCOPED_TRACE("resumed as " + target.describe() + " at ZeRO stage " + std::to_string(zero_stage));
    StageRun run = make_run(world_, target, zero_stage);
    if (run.engine) {
      const LoadedCheckpoint loaded = ckpt::load_checkpoint_on(ranks_of(run, *world_), dir.path(), "latest");
      EXPECT_EQ(loaded.saved_pipeline_stages, 4);
      EXPECT_EQ(loaded.extra_int("next_step"), 3);
      EXPECT_EQ(run.engine->global_steps(), kSaved);
      EXPECT_EQ(run.engine->micro_steps(), kSaved * run.engine->gradient_accumulation_steps());
    }
    EXPECT_EQ(first_bit_difference(model_state(run, *world_), saved_state), "");
    train(run, kSaved, kMore);
    std::string worst;
    const double err = max_relative_error(model_state(run, *world_), want, &worst);
    EXPECT_LE(err, kTolerance) << "largest difference at " << worst;
    if (target.stages == 4) {
      EXPECT_EQ(err, 0.0) << "the same layout resumes bit for bit";
    }
    ::testing::Test::RecordProperty("max_relative_error_" + std::to_string(target.stages) + "x" +
                                        std::to_string(target.ranks) + "_z" + std::to_string(zero_stage),
                                    ::testing::PrintToString(err));
  }

  // Consolidation: every layer's weights, as the 4-stage run held them at the save.
  if (world_->rank() == 0) {
    const fs::path out = dir.path() / "hf";
    ExportOptions options;
    options.dtype = DType::f32;
    consolidate_checkpoint(dir.path(), "latest", out, options);
    safetensors::SafetensorsReader reader(out / "model.safetensors");
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float>& master = saved_state.at(layer_name(l) + ".master");
      std::vector<float> w(static_cast<size_t>(width(l + 1) * width(l)));
      reader.read_range(layer_name(l) + ".w", 0, static_cast<int64_t>(w.size()), w.data());
      EXPECT_EQ(std::vector<float>(master.begin(), master.begin() + static_cast<int64_t>(w.size())), w) << l;
    }
  }
  world_->barrier();
}

TEST_P(PipelineCheckpointStages, OneEnginesCheckpointResumesAtFourStages) {
  const int zero_stage = GetParam();
  SharedTempDir dir(*world_, "zero3-ckpt-pipe-plain");
  std::map<std::string, std::vector<float>> saved_state;
  {
    StageRun run = make_run(world_, Layout{0, 4}, zero_stage);
    train(run, 0, kSaved);
    saved_state = model_state(run, *world_);
    save_checkpoint(*run.engine, dir.path(), "plain");
  }
  StageRun run = make_run(world_, Layout{4, 4}, zero_stage);
  const LoadedCheckpoint loaded = ckpt::load_checkpoint_on(ranks_of(run, *world_), dir.path(), "latest");
  EXPECT_EQ(loaded.saved_pipeline_stages, 1);
  EXPECT_TRUE(loaded.resharded);
  EXPECT_EQ(run.engine->micro_steps(), kSaved);  // a stage engine: one micro-step per optimizer step
  EXPECT_EQ(first_bit_difference(model_state(run, *world_), saved_state), "");
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, PipelineCheckpointStages, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "Zero" + std::to_string(i.param); });

// Every rank throws a CheckpointError whose text holds `parts`.
template <typename F>
void expect_refused_everywhere(F&& load, const std::vector<std::string>& parts) {
  try {
    load();
    ADD_FAILURE() << "loaded";
  } catch (const CheckpointError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(PipelineCheckpointRefusals, AStageOfAnotherModelIsNamed) {
  auto world = engine_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  SharedTempDir dir(*world, "zero3-ckpt-pipe-bad");
  {
    StageRun run = make_run(world, Layout{4, 4}, 3);
    train(run, 0, 1);
    ckpt::save_checkpoint_on_node(ranks_of(run, *world), dir.path(), "one", {}, "node");
  }
  auto declare_with = [](int l_changed, int64_t rows, const std::string& renamed) {
    return [=](Engine& e, int stage) {
      for (int l = stage * 4; l < (stage + 1) * 4; ++l) {
        const int64_t out = l == l_changed ? rows : width(l + 1);
        const std::string name = l == l_changed && !renamed.empty() ? renamed : layer_name(l);
        e.add_unit(name, {{"w", {out, width(l)}, ParamInit::zeros()}, {"b", {out}, ParamInit::zeros()}});
      }
    };
  };
  {
    // Stage 1 of 2 declares layers.5 with 9 rows.
    StageRun run = make_run(world, Layout{2, 4}, 3, declare_with(5, 9, ""));
    expect_refused_everywhere([&] { ckpt::load_checkpoint_on(ranks_of(run, *world), dir.path(), "latest"); },
                              {"'layers.5.w'", "[9, "});
  }
  {
    // Stage 0 of 2 declares "adapter" where the checkpoint has layers.2.
    StageRun run = make_run(world, Layout{2, 4}, 3, declare_with(2, width(3), "adapter"));
    expect_refused_everywhere([&] { ckpt::load_checkpoint_on(ranks_of(run, *world), dir.path(), "latest"); },
                              {"'adapter' is not in the checkpoint"});
  }
  {
    // The stages hold 7 of the checkpoint's 8 layers.
    StageRun run = make_run(world, Layout{2, 4}, 3, [](Engine& e, int stage) {
      for (int l = stage * 4; l < (stage + 1) * 4 - (stage == 1 ? 1 : 0); ++l) {
        e.add_unit(layer_name(l),
                   {{"w", {width(l + 1), width(l)}, ParamInit::zeros()}, {"b", {width(l + 1)}, ParamInit::zeros()}});
      }
    });
    expect_refused_everywhere([&] { ckpt::load_checkpoint_on(ranks_of(run, *world), dir.path(), "latest"); },
                              {"layers.7", "in no pipeline stage"});
  }
  {
    // One Engine without the last layer.
    StageRun run = make_run(world, Layout{0, 4}, 3, [](Engine& e, int) {
      for (int l = 0; l < kLayers - 1; ++l) {
        e.add_unit(layer_name(l),
                   {{"w", {width(l + 1), width(l)}, ParamInit::zeros()}, {"b", {width(l + 1)}, ParamInit::zeros()}});
      }
    });
    expect_refused_everywhere([&] { load_checkpoint(*run.engine, dir.path()); },
                              {"8 units", "'layers.7' in the checkpoint"});
  }
}

}  // namespace
}  // namespace zero3::testing

// Resharding without a conversion step: a checkpoint saved by 4 ranks loads on 1, 2 and 3 ranks (engines built
// on sub-communicators of the 4-rank job), at stage 3 and at other stages. Right after the load, the weights and
// the Adam state are bit for bit the saved ones; training then goes on as the 4-rank run that never stopped,
// within fp32 round-off (the global batch is the same 12 micro-batches per step on every world size; only the
// order of the reductions differs).
// zero3-test-ranks: 4
#include <gtest/gtest.h>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"

namespace zero3::testing {
namespace {

constexpr int64_t kMicroBatchesPerStep = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int64_t kSaved = 3, kMore = 3;      // optimizer steps before and after the checkpoint

Config config_for(int stage, int world) {
  Config c = equivalence_config(stage);
  c.gradient_accumulation_steps = kMicroBatchesPerStep / world;
  return c;
}

// Same bound as the fp32 equivalence tests: reductions in another order change the last bits, and three Adam
// steps carry that through.
constexpr double kTolerance = 1e-5;

struct Target {
  int world;
  int stage;
};

void reshard_and_continue(int saved_stage) {
  auto world = engine_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  SharedTempDir dir(*world, "zero3-ckpt-reshard");
  TrainPlan plan;
  plan.world = 4;

  MlpEngine straight = make_mlp_engine(config_for(saved_stage, 4), world, cpu_device());
  train_steps(*straight.engine, straight.units, plan, 0, kSaved + kMore);
  const auto want = gather_all_state(*straight.engine);

  std::map<std::string, std::vector<float>> saved_state;
  {
    MlpEngine run = make_mlp_engine(config_for(saved_stage, 4), world, cpu_device());
    train_steps(*run.engine, run.units, plan, 0, kSaved);
    saved_state = gather_all_state(*run.engine);
    save_checkpoint(*run.engine, dir.path(), "step3");
  }

  for (const Target t : {Target{1, 3}, Target{2, 3}, Target{3, 3}, Target{2, 1}, Target{3, 2}, Target{3, 0}}) {
    SCOPED_TRACE("saved by 4 ranks at stage " + std::to_string(saved_stage) + ", loaded by " + std::to_string(t.world) +
                 " at stage " + std::to_string(t.stage));
    std::unique_ptr<Communicator> sub = world->split(world->rank() < t.world ? 0 : -1, world->rank());
    if (sub) {
      std::shared_ptr<Communicator> comm(std::move(sub));
      ASSERT_EQ(comm->size(), t.world);
      MlpEngine e = make_mlp_engine(config_for(t.stage, t.world), comm, cpu_device());
      const LoadedCheckpoint loaded = load_checkpoint(*e.engine, dir.path());
      EXPECT_TRUE(loaded.resharded);
      EXPECT_EQ(loaded.saved_world_size, 4);
      EXPECT_EQ(e.engine->global_steps(), kSaved);
      EXPECT_EQ(e.engine->micro_steps(), kSaved * kMicroBatchesPerStep / t.world);
      EXPECT_EQ(first_bit_difference(gather_all_state(*e.engine), saved_state), "");
      TrainPlan p = plan;
      p.world = t.world;
      train_steps(*e.engine, e.units, p, kSaved, kMore);
      std::string worst;
      const double err = max_relative_error(gather_all_state(*e.engine), want, &worst);
      EXPECT_LE(err, kTolerance) << "largest difference at " << worst;
      ::testing::Test::RecordProperty("max_relative_error_w" + std::to_string(t.world) + "_s" + std::to_string(t.stage),
                                      ::testing::PrintToString(err));
    }
    world->barrier();
  }
}

TEST(CheckpointReshard, SavedAtStage3LoadsOnOneTwoAndThreeRanks) { reshard_and_continue(3); }

TEST(CheckpointReshard, SavedAtStage0LoadsOnOneTwoAndThreeRanks) { reshard_and_continue(0); }

}  // namespace
}  // namespace zero3::testing

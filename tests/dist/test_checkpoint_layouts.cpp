// A checkpoint saved under one layout resumes under another: plain ZeRO-3, HSDP (MiCS with a shard group of one node),
// MiCS over every node with the hierarchical gather and hpZ, on nodes simulated by `zero3 launch --simulate-nodes`.
// Under MiCS only the first shard group's ranks write files (every group holds the whole model). Right after the load
// the weights and the Adam state are bit for bit the saved ones; training then goes on as the run that never stopped,
// within fp32 round-off (only the order of the reductions differs between layouts). Also: the MiCS checkpoint loads
// on fewer ranks (one node), and MiCS refuses node-local checkpoints.
// zero3-test-ranks:
// zero3-test-nodes: 2x2 3x2
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"

namespace zero3::testing {
namespace {

constexpr int64_t kSaved = 3, kMore = 3;  // optimizer steps before and after the checkpoint
constexpr double kTolerance = 1e-5;       // as the fp32 equivalence tests

struct Layout {
  std::string name;
  std::function<void(Config&)> set;
};

int per_node() { return detect_launch().local_world_size; }

const Layout kPlain{"plain", [](Config&) {}};
const Layout kHsdp{"hsdp", [](Config& c) { c.zero.mics_shard_size = per_node(); }};
const Layout kMicsHierarchical{"mics_hierarchical", [](Config& c) {
                                 c.zero.mics_shard_size = detect_launch().world_size;
                                 c.zero.mics_hierarchical_params_gather = true;
                               }};
const Layout kHpz{"hpz", [](Config& c) { c.zero.hpz_partition_size = per_node(); }};

Config config_for(const Layout& layout) {
  Config c = equivalence_config(3);
  layout.set(c);
  return c;
}

void save_under_and_resume_under(const Layout& saved, const Layout& resumed) {
  SCOPED_TRACE("saved under " + saved.name + ", resumed under " + resumed.name);
  auto world = engine_world();
  SharedTempDir dir(*world, "zero3-ckpt-layouts");
  TrainPlan plan;
  plan.world = world->size();

  MlpEngine straight = make_mlp_engine(config_for(saved), world, cpu_device());
  train_steps(*straight.engine, straight.units, plan, 0, kSaved + kMore);
  const auto want = gather_all_state(*straight.engine);

  std::map<std::string, std::vector<float>> saved_state;
  {
    MlpEngine run = make_mlp_engine(config_for(saved), world, cpu_device());
    train_steps(*run.engine, run.units, plan, 0, kSaved);
    saved_state = gather_all_state(*run.engine);
    const SavedCheckpoint s = save_checkpoint(*run.engine, dir.path(), "step3");
    const int savers = run.engine->partition_size();
    EXPECT_EQ(s.files, savers) << "only the first shard group writes";
    EXPECT_EQ(s.rank_bytes > 0, world->rank() < savers);
  }
  MlpEngine e = make_mlp_engine(config_for(resumed), world, cpu_device());
  const LoadedCheckpoint loaded = load_checkpoint(*e.engine, dir.path());
  auto partition = [&](const Layout& l) {
    const int64_t mics = config_for(l).zero.mics_shard_size;
    return mics > 0 ? mics : static_cast<int64_t>(world->size());
  };
  EXPECT_EQ(loaded.resharded, partition(saved) != partition(resumed));
  EXPECT_EQ(e.engine->global_steps(), kSaved);
  EXPECT_EQ(first_bit_difference(gather_all_state(*e.engine), saved_state), "");
  train_steps(*e.engine, e.units, plan, kSaved, kMore);
  std::string worst;
  const double err = max_relative_error(gather_all_state(*e.engine), want, &worst);
  EXPECT_LE(err, kTolerance) << "largest difference at " << worst;
}

TEST(CheckpointLayouts, PlainToHsdp) { save_under_and_resume_under(kPlain, kHsdp); }
TEST(CheckpointLayouts, HsdpToHpz) { save_under_and_resume_under(kHsdp, kHpz); }
TEST(CheckpointLayouts, HpzToMicsHierarchical) { save_under_and_resume_under(kHpz, kMicsHierarchical); }
TEST(CheckpointLayouts, MicsHierarchicalToHsdp) { save_under_and_resume_under(kMicsHierarchical, kHsdp); }
TEST(CheckpointLayouts, HsdpToPlain) { save_under_and_resume_under(kHsdp, kPlain); }

// An HSDP checkpoint of the whole job loads on the ranks of one node alone (another world size, plain ZeRO-3).
TEST(CheckpointLayouts, HsdpLoadsOnOneNode) {
  auto world = engine_world();
  SharedTempDir dir(*world, "zero3-ckpt-layouts");
  TrainPlan plan;
  plan.world = world->size();
  std::map<std::string, std::vector<float>> saved_state;
  {
    MlpEngine run = make_mlp_engine(config_for(kHsdp), world, cpu_device());
    train_steps(*run.engine, run.units, plan, 0, kSaved);
    saved_state = gather_all_state(*run.engine);
    save_checkpoint(*run.engine, dir.path(), "step3");
  }
  std::unique_ptr<Communicator> sub = world->split(world->rank() < per_node() ? 0 : -1, world->rank());
  if (sub) {
    std::shared_ptr<Communicator> comm(std::move(sub));
    MlpEngine e = make_mlp_engine(equivalence_config(3), comm, cpu_device());
    const LoadedCheckpoint loaded = load_checkpoint(*e.engine, dir.path());
    EXPECT_TRUE(loaded.resharded);
    EXPECT_EQ(loaded.saved_world_size, world->size());
    EXPECT_EQ(first_bit_difference(gather_all_state(*e.engine), saved_state), "");
  }
  world->barrier();
}

TEST(CheckpointLayouts, MicsRefusesNodeLocalCheckpoints) {
  auto world = engine_world();
  SharedTempDir dir(*world, "zero3-ckpt-layouts");
  Config c = config_for(kHsdp);
  c.checkpoint.use_node_local_storage = true;
  MlpEngine e = make_mlp_engine(c, world, cpu_device());
  try {
    save_checkpoint(*e.engine, dir.path(), "step0");
    FAIL() << "no error";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("checkpoint.use_node_local_storage with MiCS"), std::string::npos)
        << err.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "latest"));
}

}  // namespace
}  // namespace zero3::testing

// Layouts that do not fit the job are errors before anything is allocated, on every rank, naming the key, its value
// and the world's layout: a group size that does not fit the simulated nodes, and nodes that do not hold the same
// number of ranks (at materialize, where the ranks compare what their launcher said: the engine then holds no byte);
// hpZ or MiCS below stage 3, both together, and hpZ with parameter offload (at construction, with the same verdicts as
// the copy of that rule zero3 plan --advise calls). Plain ZeRO-3 on such nodes runs on, counting every rank as one
// node.
// zero3-test-ranks: 4
// zero3-test-nodes: 2x2
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "config/config_checks.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

// The engine's own check (resolve() checks the group sizes against the world size too, without the nodes): the
// config is resolved with the plain layout, then given the layout to check.
std::string materialize_error(const Config& c) {
  std::unique_ptr<Engine> engine;
  try {
    Config plain = c;
    plain.zero.mics_shard_size = -1;
    plain.zero.mics_hierarchical_params_gather = false;
    plain.zero.hpz_partition_size = 1;
    Config resolved = resolved_for(plain, *engine_world());
    resolved.zero.mics_shard_size = c.zero.mics_shard_size;
    resolved.zero.mics_hierarchical_params_gather = c.zero.mics_hierarchical_params_gather;
    resolved.zero.hpz_partition_size = c.zero.hpz_partition_size;
    engine = std::make_unique<Engine>(resolved, engine_world(), cpu_device());
    declare_mlp(*engine, MlpDims{});
    engine->materialize();
  } catch (const ConfigError& e) {
    // Before any allocation: the engine that refused holds nothing.
    if (engine) {
      EXPECT_EQ(engine->memory().peak_total, 0) << "allocated before the error: " << e.what();
    }
    return e.what();
  }
  return "";
}

// The error of constructing an engine with `c` (resolved as is), or "" when it constructs.
template <typename E>
std::string construction_error(const Config& c) {
  try {
    Engine engine(resolved_for(c, *engine_world()), engine_world(), cpu_device());
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(LayoutErrors, AGroupThatDoesNotFitTheNodes) {
  const LaunchInfo launch = detect_launch();
  if (launch.local_world_size != 2 || launch.world_size != 4) GTEST_SKIP() << "runs on 2 simulated nodes of 2";
  Config c = equivalence_config(3);
  c.zero.mics_shard_size = 3;
  std::string e = materialize_error(c);
  EXPECT_NE(e.find("zero_optimization.mics_shard_size: 3 does not divide the world size (4 ranks on 2 nodes x 2)"),
            std::string::npos)
      << e;
  c = equivalence_config(3);
  c.zero.mics_shard_size = 2;
  c.zero.mics_hierarchical_params_gather = true;
  e = materialize_error(c);
  EXPECT_NE(e.find("zero_optimization.mics_hierarchical_params_gather: true with mics_shard_size 2 (4 ranks on 2 "
                   "nodes x 2)"),
            std::string::npos)
      << e;
}

// A config built in code gets the checks of one read from a file.
TEST(LayoutErrors, BelowStage3OrTogether) {
  for (int stage : {1, 2}) {
    Config c = equivalence_config(stage);
    c.zero.hpz_partition_size = 2;
    std::string e = construction_error<ConfigError>(c);
    EXPECT_NE(e.find("zero_optimization.zero_hpz_partition_size: got 2 with zero_optimization.stage " +
                     std::to_string(stage) + ", expected zero_optimization.stage 3"),
              std::string::npos)
        << e;
    c = equivalence_config(stage);
    c.zero.mics_shard_size = 2;
    e = construction_error<ConfigError>(c);
    EXPECT_NE(e.find("zero_optimization.mics_shard_size: got 2 with zero_optimization.stage " + std::to_string(stage) +
                     ", expected zero_optimization.stage 3"),
              std::string::npos)
        << e;
  }
  Config c = equivalence_config(3);
  c.zero.hpz_partition_size = 2;
  c.zero.mics_shard_size = 2;
  const std::string e = construction_error<ConfigError>(c);
  EXPECT_NE(e.find("zero_optimization.zero_hpz_partition_size: got 2 with zero_optimization.mics_shard_size 2, "
                   "expected one of the two"),
            std::string::npos)
      << e;
}

// Nodes of 2, 1 and 1 ranks, as an uneven Slurm allocation reports them: the launcher's variables are set by hand
// before the engine reads them.
class UnevenNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    const LaunchInfo launch = detect_launch();
    if (launch.world_size != 4 || launch.local_world_size != 4) GTEST_SKIP() << "runs on 4 ranks of one node";
    saved_ = launch;
    const int r = launch.rank;
    const int node = r < 2 ? 0 : r - 1;
    setenv("LOCAL_WORLD_SIZE", r < 2 ? "2" : "1", 1);
    setenv("LOCAL_RANK", std::to_string(r < 2 ? r : 0).c_str(), 1);
    setenv("GROUP_RANK", std::to_string(node).c_str(), 1);
  }
  void TearDown() override {
    setenv("LOCAL_WORLD_SIZE", std::to_string(saved_.local_world_size).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(saved_.local_rank).c_str(), 1);
    setenv("GROUP_RANK", std::to_string(saved_.node_rank).c_str(), 1);
  }
  LaunchInfo saved_;
};

TEST_F(UnevenNodes, AreAnErrorForHpzAndMicsOnEveryRank) {
  for (bool mics : {false, true}) {
    Config c = equivalence_config(3);
    (mics ? c.zero.mics_shard_size : c.zero.hpz_partition_size) = 2;
    const std::string e = materialize_error(c);
    const std::string key =
        mics ? "zero_optimization.mics_shard_size: 2" : "zero_optimization.zero_hpz_partition_size: 2";
    EXPECT_NE(e.find(key + " needs every node to run the same number of ranks"), std::string::npos) << e;
    EXPECT_NE(e.find("ranks 0, 1 on node 0 of 2 ranks; rank 2 on node 1 of 1 rank; rank 3 on node 2 of 1 rank"),
              std::string::npos)
        << e;
  }
}

TEST_F(UnevenNodes, PlainZero3RunsOn) {
  Engine engine(resolved_for(equivalence_config(3), *engine_world()), engine_world(), cpu_device());
  MlpUnits units = declare_mlp(engine, MlpDims{});
  engine.materialize();
  TrainPlan plan;
  plan.world = 4;
  plan.steps = 1;
  EngineRun run = train_mlp(engine, units, plan);
  EXPECT_TRUE(run.steps.back().applied);
  EXPECT_EQ(engine.schedule_stats().gather_traffic.inter_node_bytes, 0) << "every rank counts as one node";
}

}  // namespace

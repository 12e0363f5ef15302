// checkpoint.use_node_local_storage: every node keeps its own checkpoint directory. Four ranks play two nodes
// (ranks 0-1 on "node-a", 2-3 on "node-b", each node with its own directory): each node's first rank commits a
// complete manifest and DIR/latest in its node's directory, beside its own ranks' files only. The same ranks load
// it back exactly; a load that needs another node's files says which file and why.
// zero3-test-ranks: 4
#include <gtest/gtest.h>

#include "checkpoint/save_on_node.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointNodeLocal, EachNodeHoldsItsRanksFilesAndAManifest) {
  auto world = engine_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  SharedTempDir root(*world, "zero3-ckpt-node-local");
  const int rank = world->rank();
  const std::string node = rank < 2 ? "node-a" : "node-b";
  const fs::path dir = root.path() / node;
  Config c = equivalence_config(3);
  c.checkpoint.use_node_local_storage = true;
  TrainPlan plan;
  plan.world = 4;

  MlpEngine m = make_mlp_engine(c, world, cpu_device());
  train_steps(*m.engine, m.units, plan, 0, 2);
  const auto saved_state = gather_all_state(*m.engine);
  const SavedCheckpoint saved = ckpt::save_checkpoint_on_node(*m.engine, dir, "s2", {{"epoch", "1"}}, node);
  EXPECT_EQ(saved.files, 4);
  world->barrier();

  // Each node's directory: a full manifest naming all four files, DIR/latest, and its own two files.
  const CheckpointInfo info = read_checkpoint_info(dir);
  EXPECT_EQ(info.files.size(), 4u);
  EXPECT_EQ(info.extras.at("epoch"), "1");
  for (int r = 0; r < 4; ++r) {
    const bool mine = (r < 2) == (rank < 2);
    EXPECT_EQ(fs::exists(dir / "s2" / info.files[static_cast<size_t>(r)].name), mine) << "rank " << r << "'s file";
  }
  // Both nodes' manifests are the same text: the same creation time from rank 0's clock.
  const std::string other = rank < 2 ? "node-b" : "node-a";
  EXPECT_EQ(read_checkpoint_info(root.path() / other).created, info.created);

  // The same ranks load it back exactly.
  MlpEngine back = make_mlp_engine(c, world, cpu_device());
  load_checkpoint(*back.engine, dir);
  EXPECT_EQ(first_bit_difference(gather_all_state(*back.engine), saved_state), "");

  // Ranks 0 and 1 alone need node-b's files too.
  std::unique_ptr<Communicator> sub = world->split(rank < 2 ? 0 : -1, rank);
  if (sub) {
    MlpEngine two = make_mlp_engine(c, std::shared_ptr<Communicator>(std::move(sub)), cpu_device());
    try {
      load_checkpoint(*two.engine, dir);
      ADD_FAILURE() << "loaded without node-b's files";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("rank-00002-of-00004.safetensors: missing"), std::string::npos) << msg;
      EXPECT_NE(msg.find("use_node_local_storage"), std::string::npos) << msg;
    }
  }
  world->barrier();
}

}  // namespace
}  // namespace zero3::testing

// The process groups of every layout made by Communicator::split on real Gloo communicators, on nodes simulated by
// `zero3 launch --simulate-nodes` (each rank sees its node's LOCAL_WORLD_SIZE, LOCAL_RANK and GROUP_RANK) and on one
// node: the launcher's variables give the node layout, and every group's communicator holds exactly the ranks
// topology.hpp names, in its order (an all-gather of the members' world ranks), and sums over them.
// zero3-test-ranks: 2 4
// zero3-test-nodes: 2x2 3x2
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "support/engine_world.hpp"
#include "zero/process_groups.hpp"
#include "zero/topology.hpp"
#include "zero3/comm.hpp"

using namespace zero3;
using namespace zero3::detail;
using zero3::testing::engine_world;

namespace {

NodeLayout launcher_nodes() {
  const LaunchInfo launch = detect_launch();
  return make_node_layout(launch.world_size, launch.local_world_size, "the launcher");
}

// The members of `comm`, in its rank order, as world ranks; and the sum of (world rank + 1) over them.
void expect_members(Communicator& comm, const RankGroup& group, int world_rank, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(comm.size(), group.size());
  ASSERT_EQ(comm.rank(), group.index_of(world_rank));
  std::vector<float> members(static_cast<size_t>(comm.size()));
  float mine = static_cast<float>(world_rank);
  comm.all_gather_into(members.data(), &mine, 1, DType::f32)->wait();
  std::vector<int> got(members.begin(), members.end());
  EXPECT_EQ(got, group.ranks);
  float sum = static_cast<float>(world_rank + 1);
  comm.all_reduce(&sum, 1, DType::f32, ReduceOp::sum)->wait();
  int want = 0;
  for (int r : group.ranks) want += r + 1;
  EXPECT_EQ(sum, static_cast<float>(want));
}

TEST(ProcessGroups, TheLauncherNumbersRanksNodeByNode) {
  const LaunchInfo launch = detect_launch();
  auto world = engine_world();
  ASSERT_EQ(launch.world_size, world->size());
  const NodeLayout nodes = launcher_nodes();
  EXPECT_EQ(launch.node_rank, nodes.node_of(world->rank()));
  EXPECT_EQ(launch.local_rank, nodes.local_rank(world->rank()));
}

TEST(ProcessGroups, EveryColoringSplitsIntoItsGroups) {
  auto world = engine_world();
  const int rank = world->rank();
  const NodeLayout nodes = launcher_nodes();
  ZeroConfig z;
  z.stage = 3;
  const ShardLayout plain = make_shard_layout(z, nodes);
  const std::vector<std::pair<std::string, std::function<RankGroup(int)>>> kinds = {
      {"intra-node group", [&](int r) { return plain.intra_node_group(r); }},
      {"inter-node group", [&](int r) { return plain.inter_node_group(r); }},
  };
  for (const auto& [what, group_of] : kinds) {
    const RankGroup g = group_of(rank);
    auto comm = world->split(g.color, rank);
    ASSERT_NE(comm, nullptr);
    expect_members(*comm, g, rank, what);
  }
}

TEST(ProcessGroups, MicsHsdpAndHpzGroupsOfEveryLayoutThatFits) {
  auto world = engine_world();
  const int rank = world->rank();
  const NodeLayout nodes = launcher_nodes();
  std::vector<ZeroConfig> configs;
  for (int size = 1; size <= nodes.world; ++size) {
    if (nodes.world % size != 0) continue;
    if (nodes.ranks_per_node % size != 0 && size % nodes.ranks_per_node != 0) continue;
    ZeroConfig mics;
    mics.stage = 3;
    mics.mics_shard_size = size;
    configs.push_back(mics);
    if (size % nodes.ranks_per_node == 0 && size / nodes.ranks_per_node >= 2) {
      mics.mics_hierarchical_params_gather = true;
      configs.push_back(mics);
    }
    ZeroConfig hpz;
    hpz.stage = 3;
    hpz.hpz_partition_size = size;
    configs.push_back(hpz);
  }
  for (const ZeroConfig& z : configs) {
    const ShardLayout layout = make_shard_layout(z, nodes);
    SCOPED_TRACE(layout.describe());
    ProcessGroups g = make_process_groups(world, layout);
    ASSERT_TRUE(g.world);
    ASSERT_TRUE(g.shard);
    EXPECT_EQ(g.world.comm.get(), world.get());
    expect_members(*g.shard.comm, layout.kind == LayoutKind::mics ? layout.shard_group(rank) : layout.world_group(),
                   rank, "shard group");
    if (layout.kind == LayoutKind::mics && layout.replicas() > 1) {
      ASSERT_TRUE(g.replica);
      expect_members(*g.replica.comm, layout.replica_group(rank), rank, "replica group");
    } else {
      EXPECT_FALSE(g.replica);
    }
    if (layout.kind == LayoutKind::hpz) {
      ASSERT_TRUE(g.hpz);
      expect_members(*g.hpz.comm, layout.hpz_group(rank), rank, "hpZ group");
    } else {
      EXPECT_FALSE(g.hpz);
    }
    if (layout.hierarchical) {
      ASSERT_TRUE(g.shard_inter_node && g.shard_intra_node);
      expect_members(*g.shard_inter_node.comm, layout.shard_inter_node_group(rank), rank, "shard inter-node group");
      expect_members(*g.shard_intra_node.comm, layout.shard_intra_node_group(rank), rank, "shard intra-node group");
      EXPECT_EQ(g.shard_inter_node.link.next_off_node, true);
      EXPECT_EQ(g.shard_intra_node.link.spans_nodes, false);
    }
  }
}

}  // namespace

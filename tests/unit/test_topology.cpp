// The process groups of each layout (src/zero/topology.*): node layouts, the groups of plain ZeRO-3, hpZ, MiCS
// and HSDP for every rank of 4 nodes x 2 and 3 nodes x 2, the errors for group sizes that do not fit, and the
// ring traffic model.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "zero/topology.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::detail;

namespace {

ZeroConfig stage3(int64_t hpz = 1, int64_t mics = -1, bool hierarchical = false) {
  ZeroConfig z;
  z.stage = 3;
  z.hpz_partition_size = hpz;
  z.mics_shard_size = mics;
  z.mics_hierarchical_params_gather = hierarchical;
  return z;
}

std::string config_error(const ZeroConfig& z, const NodeLayout& nodes) {
  try {
    make_shard_layout(z, nodes);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Every group kind partitions the world: each rank in exactly one group of the kind, and a rank's group, asked
// from any of its members, is the same group with the same color.
template <typename GroupOf>
void expect_partition(const ShardLayout& layout, GroupOf group_of, int expected_size) {
  std::set<int> colors;
  for (int r = 0; r < layout.nodes.world; ++r) {
    RankGroup g = group_of(r);
    ASSERT_EQ(g.size(), expected_size) << "rank " << r;
    ASSERT_GE(g.index_of(r), 0) << "rank " << r << " is not in its own group";
    for (int other : g.ranks) {
      RankGroup h = group_of(other);
      EXPECT_EQ(h.ranks, g.ranks) << "ranks " << r << " and " << other;
      EXPECT_EQ(h.color, g.color);
    }
    colors.insert(g.color);
  }
  EXPECT_EQ(static_cast<int>(colors.size()), layout.nodes.world / expected_size) << "one color per group";
}

TEST(NodeLayout, NodesAreBlocksOfConsecutiveRanks) {
  NodeLayout n = make_node_layout(8, 2, "test");
  EXPECT_EQ(n.nodes(), 4);
  EXPECT_EQ(n.node_of(5), 2);
  EXPECT_EQ(n.local_rank(5), 1);
  EXPECT_EQ(n.describe(), "8 ranks on 4 nodes x 2");
}

TEST(NodeLayout, UnevenNodesAreAnError) {
  try {
    make_node_layout(7, 4, "LOCAL_WORLD_SIZE=4");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("4 (LOCAL_WORLD_SIZE=4) does not tile the world of 7 ranks"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_node_layout(4, 0, "x"), ConfigError);
  EXPECT_THROW(make_node_layout(4, 8, "x"), ConfigError);
}

TEST(ShardLayout, PlainZero3ShardsOverTheWorld) {
  ShardLayout l = make_shard_layout(stage3(), make_node_layout(8, 2, "test"));
  EXPECT_EQ(l.kind, LayoutKind::plain);
  EXPECT_EQ(l.shard_size, 8);
  EXPECT_EQ(l.replicas(), 1);
  EXPECT_EQ(l.shard_group(5).ranks, l.world_group().ranks);
  EXPECT_EQ(l.describe(), "ZeRO-3 over 8 ranks");
}

TEST(ShardLayout, BelowStage3TheLayoutKeysDoNothing) {
  ZeroConfig z = stage3(2, -1);
  z.stage = 2;
  EXPECT_EQ(make_shard_layout(z, make_node_layout(4, 2, "test")).kind, LayoutKind::plain);
}

TEST(ShardLayout, HsdpIsMicsWithOneNodePerShardGroup) {
  for (int nodes : {2, 3, 4}) {
    SCOPED_TRACE(nodes);
    ShardLayout l = make_shard_layout(stage3(1, 2), make_node_layout(2 * nodes, 2, "test"));
    EXPECT_EQ(l.kind, LayoutKind::mics);
    EXPECT_EQ(l.shard_size, 2);
    EXPECT_EQ(l.replicas(), nodes);
    for (int r = 0; r < l.nodes.world; ++r) {
      EXPECT_EQ(l.shard_group(r).ranks, l.intra_node_group(r).ranks) << "rank " << r;
      EXPECT_EQ(l.replica_group(r).ranks, l.inter_node_group(r).ranks) << "rank " << r;
      EXPECT_EQ(l.shard_rank(r), r % 2);
    }
    expect_partition(
        l, [&](int r) { return l.shard_group(r); }, 2);
    expect_partition(
        l, [&](int r) { return l.replica_group(r); }, nodes);
    EXPECT_NE(l.describe().find("one node: HSDP"), std::string::npos) << l.describe();
  }
}

TEST(ShardLayout, MicsGroupsOfFourOnFourNodesOfTwo) {
  ShardLayout l = make_shard_layout(stage3(1, 4), make_node_layout(8, 2, "test"));
  EXPECT_EQ(l.shard_group(5).ranks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(l.replica_group(5).ranks, (std::vector<int>{1, 5}));
  EXPECT_EQ(l.shard_rank(5), 1);
  expect_partition(
      l, [&](int r) { return l.shard_group(r); }, 4);
  expect_partition(
      l, [&](int r) { return l.replica_group(r); }, 2);
}

TEST(ShardLayout, MicsHierarchicalGatherGroups) {
  // 3 nodes x 2, one shard group over all of them: between nodes the ranks of one local rank, then each node.
  ShardLayout l = make_shard_layout(stage3(1, 6, true), make_node_layout(6, 2, "test"));
  EXPECT_TRUE(l.hierarchical);
  EXPECT_EQ(l.shard_inter_node_group(3).ranks, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(l.shard_intra_node_group(3).ranks, (std::vector<int>{2, 3}));
  expect_partition(
      l, [&](int r) { return l.shard_inter_node_group(r); }, 3);
  expect_partition(
      l, [&](int r) { return l.shard_intra_node_group(r); }, 2);
  // Two shard groups of two nodes each on 4 nodes x 2.
  ShardLayout m = make_shard_layout(stage3(1, 4, true), make_node_layout(8, 2, "test"));
  EXPECT_EQ(m.shard_inter_node_group(5).ranks, (std::vector<int>{5, 7}));
  EXPECT_EQ(m.shard_inter_node_group(1).ranks, (std::vector<int>{1, 3}));
  expect_partition(
      m, [&](int r) { return m.shard_inter_node_group(r); }, 2);
}

TEST(ShardLayout, HpzGroups) {
  ShardLayout l = make_shard_layout(stage3(2), make_node_layout(6, 2, "test"));
  EXPECT_EQ(l.kind, LayoutKind::hpz);
  EXPECT_EQ(l.shard_size, 6) << "the primary partition stays over every rank";
  EXPECT_EQ(l.hpz_group(3).ranks, (std::vector<int>{2, 3}));
  expect_partition(
      l, [&](int r) { return l.hpz_group(r); }, 2);
  // A group of two nodes.
  ShardLayout two = make_shard_layout(stage3(4), make_node_layout(8, 2, "test"));
  EXPECT_EQ(two.hpz_group(5).ranks, (std::vector<int>{4, 5, 6, 7}));
}

TEST(ShardLayout, HpzOfTheWholeWorldOrMoreIsOff) {
  // DeepSpeed takes min(zero_hpz_partition_size, world): a secondary partition over the world gathers like the
  // primary one.
  EXPECT_EQ(make_shard_layout(stage3(8), make_node_layout(4, 4, "test")).kind, LayoutKind::plain);
  EXPECT_EQ(make_shard_layout(stage3(4), make_node_layout(4, 2, "test")).kind, LayoutKind::plain);
  EXPECT_EQ(make_shard_layout(stage3(1), make_node_layout(4, 2, "test")).kind, LayoutKind::plain);
  EXPECT_EQ(make_shard_layout(stage3(0), make_node_layout(4, 2, "test")).kind, LayoutKind::plain);
}

TEST(ShardLayout, GroupSizesThatDoNotFitAreErrorsNamingKeyValueAndLayout) {
  const NodeLayout six = make_node_layout(6, 2, "test");
  std::string e = config_error(stage3(1, 4), six);
  EXPECT_NE(e.find("zero_optimization.mics_shard_size: 4 does not divide the world size (6 ranks on 3 nodes x 2)"),
            std::string::npos)
      << e;
  e = config_error(stage3(1, 3), six);
  EXPECT_NE(e.find("zero_optimization.mics_shard_size: 3 neither divides nor is a multiple of the 2 ranks per node "
                   "(6 ranks on 3 nodes x 2)"),
            std::string::npos)
      << e;
  e = config_error(stage3(4), six);
  EXPECT_NE(e.find("zero_optimization.zero_hpz_partition_size: 4 does not divide the world size (6 ranks on 3 nodes "
                   "x 2)"),
            std::string::npos)
      << e;
  e = config_error(stage3(3), six);
  EXPECT_NE(e.find("zero_optimization.zero_hpz_partition_size: 3 neither divides"), std::string::npos) << e;
  e = config_error(stage3(1, 12), six);
  EXPECT_NE(e.find("zero_optimization.mics_shard_size: 12 is larger than the world"), std::string::npos) << e;
  e = config_error(stage3(1, 2, true), six);
  EXPECT_NE(e.find("zero_optimization.mics_hierarchical_params_gather: true with mics_shard_size 2 (6 ranks on 3 "
                   "nodes x 2), expected a shard group of two or more whole nodes"),
            std::string::npos)
      << e;
}

TEST(TrafficModel, RingBytes) {
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_gather, 4, 10, 2), 3 * 10 * 2);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::reduce_scatter, 4, 10, 4), 3 * 10 * 4);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_reduce, 4, 10, 4), 15 * 4);  // floor(2 * 3 * 10 / 4) = 15
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_reduce, 1, 10, 4), 0);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_gather, 1, 10, 4), 0);
}

TEST(TrafficModel, OnlyTheLastRankOfEachNodeSendsAcrossInAWorldRing) {
  ShardLayout l = make_shard_layout(stage3(), make_node_layout(6, 2, "test"));
  const RankGroup world = l.world_group();
  for (int r = 0; r < 6; ++r) {
    GroupLink link = link_of(world, l.nodes, r);
    EXPECT_TRUE(link.spans_nodes);
    EXPECT_EQ(link.next_off_node, r % 2 == 1) << "rank " << r;
    CollectiveTraffic t;
    count_collective(t, link, CollectiveKind::all_gather, 100, 2);
    EXPECT_EQ(t.collectives, 1);
    EXPECT_EQ(t.inter_node_collectives, 1);
    EXPECT_EQ(t.inter_node_bytes + t.intra_node_bytes, 5 * 100 * 2);
    EXPECT_EQ(t.inter_node_bytes, r % 2 == 1 ? 1000 : 0);
  }
  // A group within one node never crosses; one rank per node always does.
  GroupLink intra = link_of(l.intra_node_group(3), l.nodes, 3);
  EXPECT_FALSE(intra.spans_nodes);
  EXPECT_FALSE(intra.next_off_node);
  GroupLink inter = link_of(l.inter_node_group(3), l.nodes, 3);
  EXPECT_TRUE(inter.spans_nodes);
  EXPECT_TRUE(inter.next_off_node);
}

}  // namespace

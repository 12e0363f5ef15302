// Process groups from the topology: which ranks share a node, and the groups each ZeRO-3 layout gathers and
// reduces over (plain ZeRO-3, ZeRO++ hpZ, MiCS and its one-node case, FSDP2's HSDP). Pure arithmetic on the
// world size, the ranks per node and the config: the engine creates its communicators from it
// (process_groups.hpp), and the memory and traffic plans count with it.
//
// Ranks are numbered node by node, as every launcher numbers them (torchrun, `zero3 launch`, Kubeflow, Slurm,
// Open MPI's default mapping by slot): node n holds ranks [n*L, (n+1)*L) for L ranks per node.
//
//   world 8 = 4 nodes x 2           node 0    node 1    node 2    node 3
//   ranks                           0  1      2  3      4  5      6  7
//   intra-node groups               [0 1]     [2 3]     [4 5]     [6 7]
//   inter-node groups               [0 2 4 6] [1 3 5 7]                      (same local rank)
//   MiCS shard groups (size 2)      [0 1]     [2 3]     [4 5]     [6 7]      (= HSDP: one node each)
//   MiCS replica groups             [0 2 4 6] [1 3 5 7]                      (same shard rank)
//   hpZ groups (size 2)             [0 1]     [2 3]     [4 5]     [6 7]      (primary partition: all 8)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero3/config.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3::detail {

// How the world's ranks lie on nodes: `ranks_per_node` on every node.
struct NodeLayout {
  int world = 1;
  int ranks_per_node = 1;

  int nodes() const { return world / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  int local_rank(int rank) const { return rank % ranks_per_node; }
  // "8 ranks on 4 nodes x 2 ranks"
  std::string describe() const;
};

// Checks that `ranks_per_node` ranks per node tile the world. `source` says where the number came from (named in
// the error). Throws ConfigError.
NodeLayout make_node_layout(int world, int ranks_per_node, const std::string& source);

// A group of ranks a collective runs over. Its members are in ascending order, which is the order of the
// communicator Communicator::split(color, rank) makes, and the order its ring passes data in.
struct RankGroup {
  std::vector<int> ranks;
  int color = 0;  // the split color that makes it (distinct for every group of one kind)

  int size() const { return static_cast<int>(ranks.size()); }
  // The position of `rank` in the group, or -1.
  int index_of(int rank) const;
  bool spans_nodes(const NodeLayout& nodes) const;
  // The member after `rank` in the ring lies on another node.
  bool next_off_node(const NodeLayout& nodes, int rank) const;
};

// What the stage-3 parameters are partitioned over and gathered from.
enum class LayoutKind : uint8_t {
  plain,  // one partition over every rank (ZeRO-3)
  hpz,    // the primary partition over every rank, a secondary partition within each hpZ group (ZeRO++)
  mics,   // one partition per shard group, replicated across the groups (MiCS; a group of one node is HSDP)
};

// The layout a config asks for on a NodeLayout.
struct ShardLayout {
  NodeLayout nodes;
  LayoutKind kind = LayoutKind::plain;
  int shard_size = 1;         // ranks one copy of the parameters, gradients and optimizer state is sharded over
  int hpz_size = 1;           // hpZ: ranks of a secondary-partition group (1: no secondary partition)
  bool hierarchical = false;  // MiCS: gather a shard group that spans nodes between nodes first, then within

  int replicas() const { return nodes.world / shard_size; }
  // The index of `rank`'s slice in its partition.
  int shard_rank(int rank) const { return rank % shard_size; }
  // "ZeRO-3 over 8 ranks", "hpZ groups of 2 ranks (one node)", "MiCS shard groups of 2 ranks (one node: HSDP) x 4
  // replicas"
  std::string describe() const;

  RankGroup world_group() const;
  RankGroup shard_group(int rank) const;    // consecutive ranks: [s*G, (s+1)*G)
  RankGroup replica_group(int rank) const;  // the ranks with the same shard rank, one per shard group
  RankGroup hpz_group(int rank) const;      // consecutive ranks: [h*H, (h+1)*H)
  RankGroup intra_node_group(int rank) const;
  RankGroup inter_node_group(int rank) const;  // the ranks with the same local rank, one per node
  // MiCS's hierarchical gather: the ranks of this rank's shard group with its local rank (one per node the group
  // spans), and the ranks of its shard group on its node.
  RankGroup shard_inter_node_group(int rank) const;
  RankGroup shard_intra_node_group(int rank) const;
  // ZeRO++ qgZ's two all-to-all stages over the shard group: its ranks on this rank's node (the shard group itself
  // when it lies within one node), then its ranks with this rank's local rank, one per node it spans (this rank
  // alone when it lies within one node). Every member of the first is on the node, every other member of the
  // second off it.
  RankGroup qgz_intra_group(int rank) const;
  RankGroup qgz_inter_group(int rank) const;
};

// The layout of `zero` (zero_hpz_partition_size, mics_shard_size, mics_hierarchical_params_gather) on `nodes`.
// Throws ConfigError naming the key, its value and the world layout: a group size that does not divide the world,
// that neither divides nor is a multiple of the ranks per node, a hierarchical gather of a group within one node.
// A zero_hpz_partition_size of at least the world size is the whole world (DeepSpeed takes the minimum), where a
// secondary partition gathers like the primary one: hpZ is then off.
ShardLayout make_shard_layout(const ZeroConfig& zero, const NodeLayout& nodes);

// The layout the memory and traffic plans count with: make_shard_layout on `ranks_per_node` ranks per node when the
// config asks for hpZ or MiCS (ConfigError for nodes or groups that do not fit), else plain ZeRO-3 over the world.
ShardLayout plan_layout(const ZeroConfig& zero, int64_t world, int64_t ranks_per_node);

// ---- The traffic model (traffic_plan.hpp): a collective is a ring over its group, in the group's order ----

enum class CollectiveKind : uint8_t { all_gather, reduce_scatter, all_reduce, all_to_all };

// Bytes one rank sends in a collective over `group_size` ranks: all_gather and reduce_scatter of `count`
// elements per rank: (g - 1) * count; all_reduce of `count` elements: floor(2 (g - 1) count / g); all_to_all of
// `count` elements per peer: (g - 1) * count, straight to each peer (not a ring: its bytes count as inter-node when
// the group's other members are off the node, which holds for the groups qgZ uses); times `element_bytes`.
int64_t ring_bytes_sent(CollectiveKind kind, int group_size, int64_t count, int64_t element_bytes);

// What the traffic model needs of a group, seen from one of its ranks.
struct GroupLink {
  int size = 1;
  bool spans_nodes = false;    // the collective crosses between nodes
  bool next_off_node = false;  // this rank's sends go to another node
};
GroupLink link_of(const RankGroup& group, const NodeLayout& nodes, int rank);

// Adds one collective of this rank over a group to `t`.
void count_collective(CollectiveTraffic& t, const GroupLink& link, CollectiveKind kind, int64_t count,
                      int64_t element_bytes);

}  // namespace zero3::detail

// The communicators of a layout (topology.hpp), made by splitting the engine's communicator: the groups the
// engine gathers parameters over, reduces gradients over, and all-reduces the replicas over. Collective over the
// whole world: every rank makes the same calls, in the same order.
#pragma once

#include <memory>
#include <string>

#include "zero/topology.hpp"
#include "zero3/comm.hpp"

namespace zero3::detail {

// One group this rank belongs to: its communicator, its members, and what the traffic model needs of it.
struct ProcessGroup {
  std::shared_ptr<Communicator> comm;  // null for a group the layout does not use
  RankGroup ranks;
  GroupLink link;
  std::string label;  // for messages: "the MiCS replica group of ranks 1, 3", "all 4 ranks"

  explicit operator bool() const { return comm != nullptr; }
};

struct ProcessGroups {
  ShardLayout layout;
  ProcessGroup world;    // every rank: the engine's communicator
  ProcessGroup shard;    // the partition's ranks: world, or the MiCS shard group
  ProcessGroup replica;  // MiCS with two or more replicas: the ranks holding the same slices
  ProcessGroup hpz;      // hpZ: the secondary partition's group
  // MiCS's hierarchical gather: the shard group's ranks with this rank's local rank, and those on its node.
  ProcessGroup shard_inter_node;
  ProcessGroup shard_intra_node;
  // ZeRO++ qgZ: the shard group's ranks on this node, and its ranks with this local rank (ShardLayout::qgz_*_group);
  // a group of one rank has no communicator (its stage is skipped).
  ProcessGroup qgz_intra;
  ProcessGroup qgz_inter;
};

// Splits `world` so that this rank gets the communicator of `group` (every rank calls it, each with its own group of
// one kind, whose colors differ between groups), checked against the rank's expected position; `what` ("hpZ
// group") names it in labels and errors, `layout` the layout in errors. Throws CommError.
ProcessGroup split_process_group(Communicator& world, const NodeLayout& nodes, const RankGroup& group, const char* what,
                                 const std::string& layout);

// Splits `world` (rank `world->rank()` of the layout's world) into the groups `layout` uses; a plain layout makes
// none (shard is world), `quantized_gradients` adds qgZ's two. Throws what Communicator::split throws (CommError,
// TimeoutError).
ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, const ShardLayout& layout,
                                  bool quantized_gradients = false);

}  // namespace zero3::detail

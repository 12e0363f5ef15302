#include "zero/process_groups.hpp"

#include <string>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

// "the hpZ group of ranks 2, 3"; past 8 members "ranks 0, 8, 16, ..., 504 (64 ranks)".
std::string group_label(const char* what, const RankGroup& group) {
  std::string s = log::concat("the ", what, " of ranks ");
  const size_t n = group.ranks.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 3) {
      s += log::concat("..., ", group.ranks.back(), " (", n, " ranks)");
      break;
    }
    s += log::concat(i > 0 ? ", " : "", group.ranks[i]);
  }
  return s;
}

ProcessGroup split(Communicator& world, const ShardLayout& layout, const RankGroup& group, const char* what) {
  return split_process_group(world, layout.nodes, group, what, layout.describe());
}

}  // namespace

ProcessGroup split_process_group(Communicator& world, const NodeLayout& nodes, const RankGroup& group, const char* what,
                                 const std::string& layout) {
  const int rank = world.rank();
  ProcessGroup g;
  g.comm = std::shared_ptr<Communicator>(world.split(group.color, rank));
  if (!g.comm || g.comm->size() != group.size() || g.comm->rank() != group.index_of(rank)) {
    throw CommError(log::concat("splitting the ", what, " of rank ", rank, " (", layout, "): expected rank ",
                                group.index_of(rank), " of ", group.size(), ", the backend made ",
                                g.comm ? log::concat("rank ", g.comm->rank(), " of ", g.comm->size()) : "none"));
  }
  g.ranks = group;
  g.link = link_of(group, nodes, rank);
  g.label = group_label(what, group);
  return g;
}

ProcessGroups make_process_groups(std::shared_ptr<Communicator> world, const ShardLayout& layout,
                                  bool quantized_gradients) {
  const int rank = world->rank();
  ZERO3_REQUIRE(world->size() == layout.nodes.world, InvalidArgument, "process groups: the communicator has ",
                world->size(), " ranks, the layout ", layout.nodes.world);
  ProcessGroups g;
  g.layout = layout;
  g.world.comm = world;
  g.world.ranks = layout.world_group();
  g.world.link = link_of(g.world.ranks, layout.nodes, rank);
  g.world.label = log::concat("all ", world->size(), " ranks");
  g.shard = g.world;
  switch (layout.kind) {
    case LayoutKind::plain:
      break;
    case LayoutKind::hpz:
      g.hpz = split(*world, layout, layout.hpz_group(rank), "hpZ group");
      break;
    case LayoutKind::mics:
      if (layout.shard_size < layout.nodes.world) {
        g.shard = split(*world, layout, layout.shard_group(rank), "MiCS shard group");
        g.replica = split(*world, layout, layout.replica_group(rank), "MiCS replica group");
      }
      if (layout.hierarchical) {
        g.shard_inter_node =
            split(*world, layout, layout.shard_inter_node_group(rank), "shard group's inter-node group");
        g.shard_intra_node =
            split(*world, layout, layout.shard_intra_node_group(rank), "shard group's intra-node group");
      }
      break;
  }
  if (quantized_gradients) {
    // Every rank splits for both kinds, so that the calls match; a group of one rank is not used.
    g.qgz_intra = split(*world, layout, layout.qgz_intra_group(rank), "qgZ intra-node group");
    g.qgz_inter = split(*world, layout, layout.qgz_inter_group(rank), "qgZ inter-node group");
  }
  log::info_rank0("engine layout: ", layout.describe(), " (", layout.nodes.describe(), ")");
  return g;
}

}  // namespace zero3::detail

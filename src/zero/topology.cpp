#include "zero/topology.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

std::string plural(int n, const char* what) { return log::concat(n, " ", what, n == 1 ? "" : "s"); }

// The consecutive ranks [first, first + size).
RankGroup block(int first, int size, int color) {
  RankGroup g;
  g.color = color;
  for (int r = first; r < first + size; ++r) g.ranks.push_back(r);
  return g;
}

// first, first + stride, ... (count members).
RankGroup strided(int first, int stride, int count, int color) {
  RankGroup g;
  g.color = color;
  for (int i = 0; i < count; ++i) g.ranks.push_back(first + i * stride);
  return g;
}

// A group size must tile the world, and either fit whole nodes or be made of them, so that no group straddles a
// node boundary unevenly.
void check_group_size(const char* key, int64_t value, int size, const NodeLayout& nodes, const char* meaning) {
  const std::string where = nodes.describe();
  if (nodes.world % size != 0) {
    throw ConfigError(log::concat("zero_optimization.", key, ": ", value, " does not divide the world size (", where,
                                  "); ", meaning, " must tile the world: use a divisor of ", nodes.world));
  }
  const int l = nodes.ranks_per_node;
  if (l % size != 0 && size % l != 0) {
    throw ConfigError(log::concat("zero_optimization.", key, ": ", value, " neither divides nor is a multiple of the ",
                                  l, " ranks per node (", where, "); ", meaning,
                                  " would straddle nodes unevenly: use a divisor or a multiple of ", l,
                                  " (the ranks per node is the usual choice)"));
  }
}

}  // namespace

std::string NodeLayout::describe() const {
  return log::concat(plural(world, "rank"), " on ", plural(nodes(), "node"), " x ", ranks_per_node);
}

NodeLayout make_node_layout(int world, int ranks_per_node, const std::string& source) {
  ZERO3_REQUIRE(world >= 1, InvalidArgument, "node layout: world size ", world, " must be >= 1");
  if (ranks_per_node < 1 || ranks_per_node > world || world % ranks_per_node != 0) {
    throw ConfigError(log::concat("ranks per node: ", ranks_per_node, " (", source, ") does not tile the world of ",
                                  world,
                                  " ranks; every node must run the same number of ranks, numbered node by "
                                  "node"));
  }
  return NodeLayout{world, ranks_per_node};
}

int RankGroup::index_of(int rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

bool RankGroup::spans_nodes(const NodeLayout& nodes) const {
  for (int r : ranks) {
    if (nodes.node_of(r) != nodes.node_of(ranks.front())) return true;
  }
  return false;
}

bool RankGroup::next_off_node(const NodeLayout& nodes, int rank) const {
  const int i = index_of(rank);
  if (i < 0 || size() < 2) return false;
  return nodes.node_of(ranks[static_cast<size_t>((i + 1) % size())]) != nodes.node_of(rank);
}

std::string ShardLayout::describe() const {
  const int l = nodes.ranks_per_node;
  auto span = [&](int size) -> std::string {
    if (size == l) return "one node";
    if (size < l) return log::concat("within a node of ", l);
    return plural(size / l, "node");
  };
  switch (kind) {
    case LayoutKind::plain:
      return log::concat("ZeRO-3 over ", plural(nodes.world, "rank"));
    case LayoutKind::hpz:
      return log::concat("hpZ: primary partition over ", plural(nodes.world, "rank"), ", secondary within groups of ",
                         plural(hpz_size, "rank"), " (", span(hpz_size), ")");
    case LayoutKind::mics:
      return log::concat("MiCS: shard groups of ", plural(shard_size, "rank"), " (", span(shard_size),
                         shard_size == l ? ": HSDP" : "", ") x ", plural(replicas(), "replica"),
                         hierarchical ? ", hierarchical gathers" : "");
  }
  return "?";
}

RankGroup ShardLayout::world_group() const { return block(0, nodes.world, 0); }

RankGroup ShardLayout::shard_group(int rank) const {
  const int s = rank / shard_size;
  return block(s * shard_size, shard_size, s);
}

RankGroup ShardLayout::replica_group(int rank) const {
  const int i = shard_rank(rank);
  return strided(i, shard_size, replicas(), i);
}

RankGroup ShardLayout::hpz_group(int rank) const {
  const int h = rank / hpz_size;
  return block(h * hpz_size, hpz_size, h);
}

RankGroup ShardLayout::intra_node_group(int rank) const {
  const int n = nodes.node_of(rank);
  return block(n * nodes.ranks_per_node, nodes.ranks_per_node, n);
}

RankGroup ShardLayout::inter_node_group(int rank) const {
  const int i = nodes.local_rank(rank);
  return strided(i, nodes.ranks_per_node, nodes.nodes(), i);
}

RankGroup ShardLayout::shard_inter_node_group(int rank) const {
  const int l = nodes.ranks_per_node, s = rank / shard_size, i = nodes.local_rank(rank);
  return strided(s * shard_size + i, l, shard_size / l, s * l + i);
}

RankGroup ShardLayout::shard_intra_node_group(int rank) const { return intra_node_group(rank); }

RankGroup ShardLayout::qgz_intra_group(int rank) const {
  return shard_size <= nodes.ranks_per_node ? shard_group(rank) : intra_node_group(rank);
}

RankGroup ShardLayout::qgz_inter_group(int rank) const {
  if (shard_size <= nodes.ranks_per_node) return RankGroup{{rank}, rank};
  return shard_inter_node_group(rank);
}

ShardLayout make_shard_layout(const ZeroConfig& z, const NodeLayout& nodes) {
  ShardLayout layout;
  layout.nodes = nodes;
  layout.shard_size = nodes.world;
  const int64_t hpz = z.hpz_partition_size, mics = z.mics_shard_size;
  if (z.stage != 3) return layout;  // config_checks refuses the layouts below stage 3
  if (mics > 0) {
    if (mics > nodes.world) {
      throw ConfigError(log::concat("zero_optimization.mics_shard_size: ", mics, " is larger than the world (",
                                    nodes.describe(), "); a shard group holds at most every rank"));
    }
    check_group_size("mics_shard_size", mics, static_cast<int>(mics), nodes, "the shard groups");
    layout.kind = LayoutKind::mics;
    layout.shard_size = static_cast<int>(mics);
    layout.hierarchical = z.mics_hierarchical_params_gather;
    if (layout.hierarchical && (mics % nodes.ranks_per_node != 0 || mics / nodes.ranks_per_node < 2)) {
      throw ConfigError(log::concat(
          "zero_optimization.mics_hierarchical_params_gather: true with mics_shard_size ", mics, " (", nodes.describe(),
          "), expected a shard group of two or more whole "
          "nodes (a multiple of ",
          nodes.ranks_per_node, "): the hierarchical gather goes between nodes, then within them"));
    }
    return layout;
  }
  if (hpz > 1 && std::min<int64_t>(hpz, nodes.world) < nodes.world) {
    check_group_size("zero_hpz_partition_size", hpz, static_cast<int>(hpz), nodes, "the hpZ groups");
    layout.kind = LayoutKind::hpz;
    layout.hpz_size = static_cast<int>(hpz);
  }
  return layout;
}

ShardLayout plan_layout(const ZeroConfig& z, int64_t world, int64_t ranks_per_node) {
  if (z.stage == 3 && (z.hpz_partition_size > 1 || z.mics_shard_size > 0)) {
    return make_shard_layout(
        z, make_node_layout(static_cast<int>(world), static_cast<int>(ranks_per_node), "ranks per node"));
  }
  ShardLayout plain;
  plain.nodes = NodeLayout{static_cast<int>(world), static_cast<int>(ranks_per_node)};
  plain.shard_size = static_cast<int>(world);
  return plain;
}

int64_t ring_bytes_sent(CollectiveKind kind, int group_size, int64_t count, int64_t element_bytes) {
  const int64_t g = group_size;
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
      return (g - 1) * count * element_bytes;
    case CollectiveKind::all_reduce:
      return 2 * (g - 1) * count / g * element_bytes;
  }
  return 0;
}

GroupLink link_of(const RankGroup& group, const NodeLayout& nodes, int rank) {
  return GroupLink{group.size(), group.spans_nodes(nodes), group.next_off_node(nodes, rank)};
}

void count_collective(CollectiveTraffic& t, const GroupLink& link, CollectiveKind kind, int64_t count,
                      int64_t element_bytes) {
  t.collectives++;
  if (link.spans_nodes) t.inter_node_collectives++;
  const int64_t bytes = ring_bytes_sent(kind, link.size, count, element_bytes);
  (link.next_off_node ? t.inter_node_bytes : t.intra_node_bytes) += bytes;
}

}  // namespace zero3::detail

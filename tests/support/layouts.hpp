// The layouts the layout tests run, set on a config for the world of the launch: HSDP (MiCS with a shard group of one
// node), MiCS over every node with the hierarchical gather, and ZeRO++ hpZ with a secondary partition per node. On a
// single node the groups are half of it, so the layout still has two groups. Each setter returns false when the
// world cannot hold its layout (the caller skips it).
#pragma once

#include <functional>

#include "support/engine_world.hpp"
#include "zero3/config.hpp"

namespace zero3::testing {

using LayoutSetter = std::function<bool(Config&)>;

// A group of one node, or on a single node half of it; 0 when that is one rank or does not divide the world.
inline int node_group() {
  const LauncherNodes n = launcher_nodes();
  const int g = n.count > 1 ? n.per_node : n.per_node / 2;
  return g > 1 && detect_launch().world_size % g == 0 ? g : 0;
}

inline bool plain_layout(Config&) { return true; }

inline bool hpz_layout(Config& c) {
  c.zero.hpz_partition_size = node_group();
  return c.zero.hpz_partition_size > 1;
}

inline bool hsdp_layout(Config& c) {
  c.zero.mics_shard_size = node_group();
  return c.zero.mics_shard_size > 1;
}

inline bool mics_hierarchical_layout(Config& c) {
  const LauncherNodes n = launcher_nodes();
  if (n.count < 2) return false;
  c.zero.mics_shard_size = n.per_node * n.count;
  c.zero.mics_hierarchical_params_gather = true;
  return true;
}

}  // namespace zero3::testing

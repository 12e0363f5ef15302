// Where the ranks run and how the model state is laid out over them: the nodes (from the launcher, agreed by
// every rank) and the shard layout they give (plain, MiCS, hpZ; topology.hpp). materialize() splits the layout's
// process groups from them (process_groups.hpp).
#include <map>
#include <utility>

#include "zero/engine_impl.hpp"
#include "zero/rank_agreement.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

// The ranks per node come from the launcher's variables (detect_launch(): LOCAL_WORLD_SIZE, PET_NPROC_PER_NODE,
// OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's task counts) when they describe this communicator's world; otherwise every
// rank counts as one node. The layouts that depend on the nodes need every node to run the same number of ranks,
// numbered node by node; materialize() checks that the ranks agree (agree_on_nodes).
void EngineImpl::detect_nodes() {
  const ZeroConfig& z = config_.zero;
  int per_node = world_;
  nodes_source_ = "one node: the launcher's variables do not describe this communicator's world";
  if (stage_ranks_per_node_ > 0 && world_ % stage_ranks_per_node_ == 0) {
    // A pipeline stage's group: the pipeline engine knows where its ranks lie (the launcher's variables describe
    // the whole world, not this group).
    per_node = stage_ranks_per_node_;
    nodes_source_ = log::concat("the pipeline's stage group: ", per_node, " of its ranks per node");
  } else {
    LaunchInfo launch;
    bool from_launcher = false;
    try {
      launch = detect_launch();
      from_launcher = launch.world_size == world_ && launch.rank == rank_ && world_ > 1;
    } catch (const Error& e) {
      nodes_source_ = log::concat("one node: the launcher's variables are unreadable (", e.what(), ")");
    }
    if (from_launcher) {
      const int l = launch.local_world_size;
      launch_node_ = launch.node_rank;
      launch_local_size_ = l;
      nodes_source_ = log::concat("the launcher (", launch.launcher, ") puts rank ", rank_, " on node ",
                                  launch.node_rank, " with ", l, " rank", l == 1 ? "" : "s", " as local rank ",
                                  launch.local_rank);
      // Uneven nodes: one node for now; materialize() tells every rank at once (agree_on_nodes).
      launch_consistent_ =
          l >= 1 && world_ % l == 0 && launch.node_rank == rank_ / l && launch.local_rank == rank_ % l;
      if (launch_consistent_) per_node = l;
    }
  }
  nodes_ = make_node_layout(world_, per_node, nodes_source_);
  layout_ = make_shard_layout(z, nodes_);
  if (z.stage == 3 && z.hpz_partition_size >= world_ && world_ > 1) {
    log::info_rank0("zero_optimization.zero_hpz_partition_size ", z.hpz_partition_size, " covers the whole world of ",
                    world_, " ranks: a secondary partition over every rank would gather like the primary one, so hpZ "
                    "is off (DeepSpeed takes min(", z.hpz_partition_size, ", ", world_, "))");
  }
}

// Collective: every rank must see the same ranks per node, else the groups would differ between ranks.
void EngineImpl::agree_on_nodes() {
  if (world_ == 1) return;
  std::vector<float> mine{static_cast<float>(nodes_.ranks_per_node), launch_consistent_ ? 1.0f : 0.0f};
  if (ranks_agree(*queue_, *comm_, mine, "materialize: comparing the ranks per node", &device_) &&
      launch_consistent_) {
    return;
  }
  auto all = gather_from_ranks(*queue_, *comm_, {launch_node_, launch_local_size_},
                               "materialize: exchanging the nodes", &device_);
  std::map<std::pair<int64_t, int64_t>, std::vector<int>> by_node;
  for (int r = 0; r < world_; ++r) {
    const auto& v = all[static_cast<size_t>(r)];
    by_node[{v[0], v[1]}].push_back(r);
  }
  std::string detail;
  for (const auto& [node, ranks] : by_node) {
    detail += log::concat(detail.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks),
                          " on node ", node.first, " of ", node.second, node.second == 1 ? " rank" : " ranks");
  }
  const std::string text = log::concat("the launcher's nodes are uneven (world of ", world_, " ranks: ", detail, ")");
  const ZeroConfig& z = config_.zero;
  if (layout_.kind != LayoutKind::plain) {
    const bool mics = layout_.kind == LayoutKind::mics;
    throw ConfigError(log::concat(mics ? "zero_optimization.mics_shard_size: "
                                       : "zero_optimization.zero_hpz_partition_size: ",
                                  mics ? z.mics_shard_size : z.hpz_partition_size,
                                  " needs every node to run the same number of ranks, numbered node by node; ",
                                  text));
  }
  log::warn_rank0(text, "; the engine counts every rank as one node (ScheduleStats' inter-node traffic is then 0)");
  nodes_ = make_node_layout(world_, world_, "one node: the launcher's nodes are uneven");
  layout_ = make_shard_layout(config_.zero, nodes_);
}

}  // namespace zero3::detail

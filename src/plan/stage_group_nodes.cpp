#include "plan/stage_group_nodes.hpp"

#include <map>

#include "core/check.hpp"
#include "zero3/error.hpp"

namespace zero3::detail {

pipeline::PipelineTopology stage_topology(const Config& config, int64_t stages, int64_t world, int64_t ranks_per_node) {
  return pipeline::make_pipeline_topology(
      make_node_layout(static_cast<int>(world), static_cast<int>(ranks_per_node), "the plan's ranks per node"),
      static_cast<int>(stages),
      pipeline::parse_stage_order(config.zero3.pipeline_stage_order, "zero3.pipeline_stage_order"));
}

NodeLayout stage_group_nodes(const pipeline::PipelineTopology& t) {
  int k = -1;
  for (int s = 0; s < t.stages; ++s) {
    std::map<int, int> per_node;
    for (int r : t.data_parallel_group(t.rank_of(s, 0)).ranks) ++per_node[t.nodes.node_of(r)];
    for (const auto& [node, n] : per_node) {
      if (k < 0) k = n;
      ZERO3_REQUIRE(n == k, ConfigError, "zero3.pipeline_stage_order: ", pipeline::stage_order_name(t.order), " puts ",
                    n, " ranks of stage ", s, "'s data-parallel group on node ", node, " and ", k, " on another (",
                    t.describe(), "); the plans need the same count on every node a group spans");
    }
  }
  NodeLayout group;
  group.world = t.data_parallel();
  group.ranks_per_node = k;
  return group;
}

}  // namespace zero3::detail

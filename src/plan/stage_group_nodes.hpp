// Where a pipelined config's stages put their data-parallel groups among the nodes, as the plans and the advisor's
// engine check see one group: D = world / pipeline.stages ranks, the same number on every node the group spans.
#pragma once

#include <cstdint>

#include "pipeline/pipeline_topology.hpp"
#include "zero/topology.hpp"
#include "zero3/config.hpp"

namespace zero3::detail {

// The topology of `stages` stages (zero3.pipeline_stage_order of `config`) on world / ranks_per_node nodes. Throws
// ConfigError naming pipeline.stages (a count that does not divide the world) or the order.
pipeline::PipelineTopology stage_topology(const Config& config, int64_t stages, int64_t world, int64_t ranks_per_node);

// One data-parallel group as a world of its own: D ranks, k of them on each node it spans. Throws ConfigError naming
// zero3.pipeline_stage_order when a group has different counts on different nodes.
NodeLayout stage_group_nodes(const pipeline::PipelineTopology& topology);

}  // namespace zero3::detail

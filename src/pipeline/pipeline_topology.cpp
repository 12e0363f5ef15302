#include "pipeline/pipeline_topology.hpp"

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::pipeline {

const char* stage_order_name(StageOrder order) {
  return order == StageOrder::stages_across_nodes ? "stages_across_nodes" : "stages_within_node";
}

StageOrder parse_stage_order(const std::string& name, const std::string& key) {
  for (StageOrder o : {StageOrder::stages_across_nodes, StageOrder::stages_within_node}) {
    if (name == stage_order_name(o)) return o;
  }
  throw ConfigError(key + ": unknown stage order \"" + name +
                    "\"; expected stages_across_nodes (a stage's ranks side by side, the default) or "
                    "stages_within_node (a data-parallel index's stages side by side)");
}

int PipelineTopology::rank_of(int stage, int index) const {
  return order == StageOrder::stages_across_nodes ? stage * data_parallel() + index : index * stages + stage;
}

int PipelineTopology::stage_of(int rank) const {
  return order == StageOrder::stages_across_nodes ? rank / data_parallel() : rank % stages;
}

int PipelineTopology::index_of(int rank) const {
  return order == StageOrder::stages_across_nodes ? rank % data_parallel() : rank / stages;
}

detail::RankGroup PipelineTopology::data_parallel_group(int rank) const {
  detail::RankGroup g;
  g.color = stage_of(rank);
  for (int i = 0; i < data_parallel(); ++i) g.ranks.push_back(rank_of(g.color, i));
  return g;
}

detail::RankGroup PipelineTopology::pipeline_group(int rank) const {
  detail::RankGroup g;
  g.color = index_of(rank);
  for (int s = 0; s < stages; ++s) g.ranks.push_back(rank_of(s, g.color));
  return g;
}

int PipelineTopology::previous_stage_rank(int rank) const {
  const int s = stage_of(rank);
  return s == 0 ? -1 : rank_of(s - 1, index_of(rank));
}

int PipelineTopology::next_stage_rank(int rank) const {
  const int s = stage_of(rank);
  return s + 1 == stages ? -1 : rank_of(s + 1, index_of(rank));
}

std::string PipelineTopology::describe() const {
  const bool stage_per_nodes = order == StageOrder::stages_across_nodes && data_parallel() % nodes.ranks_per_node == 0;
  const bool stages_share_node =
      order == StageOrder::stages_across_nodes && nodes.ranks_per_node % data_parallel() == 0;
  std::string where;
  if (stage_per_nodes) {
    where = data_parallel() == nodes.ranks_per_node ? ": a stage per node" : ": a stage spans nodes";
  } else if (stages_share_node) {
    where = ": several stages per node";
  }
  return log::concat(stages, " stage", stages == 1 ? "" : "s", " x ", data_parallel(), " data-parallel rank",
                     data_parallel() == 1 ? "" : "s", " (", stage_order_name(order), where, ") on ", nodes.describe());
}

PipelineTopology make_pipeline_topology(const detail::NodeLayout& nodes, int stages, StageOrder order) {
  if (stages < 1) throw ConfigError(log::concat("pipeline.stages: ", stages, "; expected at least 1"));
  if (stages > nodes.world) {
    throw ConfigError(log::concat("pipeline.stages: ", stages, " stages for ", nodes.world,
                                  " ranks; every stage needs at least one rank"));
  }
  if (nodes.world % stages != 0) {
    throw ConfigError(log::concat("pipeline.stages: ", stages, " stages do not divide the ", nodes.world,
                                  " ranks; every stage needs the same number of data-parallel ranks (",
                                  nodes.world % stages, " left over)"));
  }
  return PipelineTopology{nodes, stages, order};
}

PipelineGroups make_pipeline_groups(const std::shared_ptr<Communicator>& world, const PipelineTopology& topology) {
  const int rank = world->rank();
  ZERO3_REQUIRE(world->size() == topology.nodes.world, InvalidArgument, "pipeline groups: the communicator has ",
                world->size(), " ranks, the topology ", topology.nodes.world);
  PipelineGroups g;
  g.topology = topology;
  g.stage = topology.stage_of(rank);
  const std::string layout = topology.describe();
  g.data_parallel = detail::split_process_group(*world, topology.nodes, topology.data_parallel_group(rank),
                                                "stage's data-parallel "
                                                "group",
                                                layout);
  g.pipeline =
      detail::split_process_group(*world, topology.nodes, topology.pipeline_group(rank), "pipeline group", layout);
  g.previous_rank = topology.previous_stage_rank(rank);
  g.next_rank = topology.next_stage_rank(rank);
  g.previous_peer = g.stage > 0 ? g.stage - 1 : -1;
  g.next_peer = g.stage + 1 < topology.stages ? g.stage + 1 : -1;
  return g;
}

}  // namespace zero3::pipeline

// Where the pipeline's stages lie among the world's ranks: S stages x D data-parallel ranks per stage (S * D = the
// world), and the communicators that follow from it. Each stage's D ranks run the stage's units under ZeRO over the
// stage's data-parallel group; activations and their gradients go between ranks of neighbouring stages with the same
// data-parallel index, over that index's pipeline group.
//
// The order decides which ranks share a stage. Ranks are numbered node by node (topology.hpp):
//
//   world 8 = 4 nodes x 2, 4 stages       node 0    node 1    node 2    node 3
//   stages_across_nodes (default)         s0 s0     s1 s1     s2 s2     s3 s3    rank = stage * D + index
//     data-parallel groups                [0 1]     [2 3]     [4 5]     [6 7]    ZeRO within a node
//     pipeline groups                     [0 2 4 6] [1 3 5 7]                      activations between nodes
//   stages_within_node                    s0 s1     s2 s3     s0 s1     s2 s3    rank = index * S + stage
//   (world 8, 2 stages: [0 2 4 6] and [1 3 5 7] are the stages; a stage's ZeRO group spans the nodes)
//
// stages_across_nodes is DeepSpeed's PipelineParallelGrid order (pipe outermost, data inner) and the one the
// pipeline exists for: with a node per stage only the stage boundaries' activations cross between nodes, while
// ZeRO's gathers and reductions stay on the node's fast links.
#pragma once

#include <memory>
#include <string>

#include "zero/process_groups.hpp"
#include "zero/topology.hpp"

namespace zero3::pipeline {

enum class StageOrder : uint8_t { stages_across_nodes, stages_within_node };

const char* stage_order_name(StageOrder order);
// The inverse of stage_order_name(); throws ConfigError naming `key`, the value and the accepted names.
StageOrder parse_stage_order(const std::string& name, const std::string& key);

struct PipelineTopology {
  detail::NodeLayout nodes;
  int stages = 1;
  StageOrder order = StageOrder::stages_across_nodes;

  int data_parallel() const { return nodes.world / stages; }
  int rank_of(int stage, int index) const;
  int stage_of(int rank) const;
  int index_of(int rank) const;  // the rank's position in its stage's data-parallel group
  // The ranks of `rank`'s stage, ascending (= data-parallel index order); color: the stage.
  detail::RankGroup data_parallel_group(int rank) const;
  // The ranks with `rank`'s data-parallel index, one per stage, ascending (= stage order); color: the index.
  detail::RankGroup pipeline_group(int rank) const;
  // The rank of the previous (next) stage with this rank's data-parallel index; -1 on the first (last) stage.
  int previous_stage_rank(int rank) const;
  int next_stage_rank(int rank) const;
  // "4 stages x 2 data-parallel ranks (stages_across_nodes: a stage per node) on 8 ranks on 4 nodes x 2 ranks"
  std::string describe() const;
};

// Throws ConfigError naming pipeline.stages and the numbers: fewer than 1 stage, more stages than ranks, a stage
// count that does not divide the ranks.
PipelineTopology make_pipeline_topology(const detail::NodeLayout& nodes, int stages,
                                        StageOrder order = StageOrder::stages_across_nodes);

// This rank's communicators of a pipeline: its stage's data-parallel group (for the stage's ZeRO engine) and its
// pipeline group (for the stage boundaries' send_recv; group rank = stage), with its neighbours' ranks in both the
// world and the pipeline group. Collective over the world: every rank calls it, in the same place.
struct PipelineGroups {
  PipelineTopology topology;
  int stage = 0;
  detail::ProcessGroup data_parallel;
  detail::ProcessGroup pipeline;
  int previous_rank = -1, next_rank = -1;  // world ranks of the neighbouring stages (-1: none)
  int previous_peer = -1, next_peer = -1;  // the same in the pipeline group (= their stages)
};

PipelineGroups make_pipeline_groups(const std::shared_ptr<Communicator>& world, const PipelineTopology& topology);

}  // namespace zero3::pipeline

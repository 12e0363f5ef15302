// Where a pipeline's stages lie (src/pipeline/pipeline_topology.hpp): both orders on the cluster shapes,
// the neighbours, and the stage counts that do not fit, each named with pipeline.stages and the numbers.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/pipeline_topology.hpp"
#include "zero3/error.hpp"

namespace zero3::pipeline {
namespace {

std::string error_of(int world, int per_node, int stages) {
  try {
    make_pipeline_topology(detail::make_node_layout(world, per_node, "test"), stages);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// 4 nodes x 4 ranks, 4 stages: a stage per node, ZeRO within it, activations between nodes.
TEST(PipelineTopology, StagesAcrossNodesPutAStageOnEachNode) {
  const auto t = make_pipeline_topology(detail::make_node_layout(16, 4, "test"), 4);
  EXPECT_EQ(t.describe(),
            "4 stages x 4 data-parallel ranks (stages_across_nodes: a stage per node) on 16 ranks on 4 "
            "nodes x 4");
  EXPECT_EQ(t.data_parallel_group(6).ranks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(t.data_parallel_group(6).color, 1);
  EXPECT_FALSE(t.data_parallel_group(6).spans_nodes(t.nodes));
  EXPECT_EQ(t.pipeline_group(6).ranks, (std::vector<int>{2, 6, 10, 14}));
  EXPECT_EQ(t.stage_of(6), 1);
  EXPECT_EQ(t.index_of(6), 2);
  EXPECT_EQ(t.previous_stage_rank(6), 2);
  EXPECT_EQ(t.next_stage_rank(6), 10);
  EXPECT_EQ(t.previous_stage_rank(2), -1);
  EXPECT_EQ(t.next_stage_rank(14), -1);
  for (int r = 0; r < 16; ++r) EXPECT_EQ(t.rank_of(t.stage_of(r), t.index_of(r)), r);
}

TEST(PipelineTopology, StagesWithinNodeSpreadEachStageOverTheNodes) {
  const auto t = make_pipeline_topology(detail::make_node_layout(8, 2, "test"), 2, StageOrder::stages_within_node);
  EXPECT_EQ(t.describe(), "2 stages x 4 data-parallel ranks (stages_within_node) on 8 ranks on 4 nodes x 2");
  EXPECT_EQ(t.data_parallel_group(3).ranks, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_TRUE(t.data_parallel_group(3).spans_nodes(t.nodes));
  EXPECT_EQ(t.pipeline_group(3).ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(t.previous_stage_rank(3), 2);
  EXPECT_EQ(t.next_stage_rank(2), 3);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(t.rank_of(t.stage_of(r), t.index_of(r)), r);
  EXPECT_EQ(parse_stage_order("stages_within_node", "k"), StageOrder::stages_within_node);
  EXPECT_THROW(parse_stage_order("pipe_major", "zero3.pipeline_stage_order"), ConfigError);
}

TEST(PipelineTopology, StageCountsThatDoNotFitAreNamed) {
  EXPECT_EQ(error_of(8, 2, 3),
            "pipeline.stages: 3 stages do not divide the 8 ranks; every stage needs the same number of data-parallel "
            "ranks (2 left over)");
  EXPECT_EQ(error_of(4, 2, 8), "pipeline.stages: 8 stages for 4 ranks; every stage needs at least one rank");
  EXPECT_EQ(error_of(4, 2, 0), "pipeline.stages: 0; expected at least 1");
}

}  // namespace
}  // namespace zero3::pipeline

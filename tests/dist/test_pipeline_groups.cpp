// A pipeline's communicators (src/pipeline/pipeline_topology.hpp) made by Communicator::split on real Gloo
// communicators, on one node and on nodes simulated by `zero3 launch --simulate-nodes`, in both stage orders: each
// stage's data-parallel group holds exactly its ranks (an all-gather of the members' world ranks, a sum over them),
// and an activation sent along every pipeline group from stage to stage, then its gradient back, arrives exactly.
// zero3-test-ranks: 2 4
// zero3-test-nodes: 2x2 2x3
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/pipeline_topology.hpp"
#include "support/engine_world.hpp"
#include "zero3/comm.hpp"

using namespace zero3;
using zero3::testing::engine_world;

namespace {

detail::NodeLayout launcher_nodes() {
  const LaunchInfo launch = detect_launch();
  return detail::make_node_layout(launch.world_size, launch.local_world_size, "the launcher");
}

void expect_members(Communicator& comm, const detail::RankGroup& group, int world_rank) {
  ASSERT_EQ(comm.size(), group.size());
  ASSERT_EQ(comm.rank(), group.index_of(world_rank));
  std::vector<float> members(static_cast<size_t>(comm.size()));
  float mine = static_cast<float>(world_rank);
  comm.all_gather_into(members.data(), &mine, 1, DType::f32)->wait();
  EXPECT_EQ(std::vector<int>(members.begin(), members.end()), group.ranks);
  float sum = static_cast<float>(world_rank + 1);
  comm.all_reduce(&sum, 1, DType::f32, ReduceOp::sum)->wait();
  int want = 0;
  for (int r : group.ranks) want += r + 1;
  EXPECT_EQ(sum, static_cast<float>(want));
}

TEST(PipelineGroups, EveryStageCountAndOrderSplitsAndPassesActivations) {
  auto world = engine_world();
  const int rank = world->rank();
  const detail::NodeLayout nodes = launcher_nodes();
  for (pipeline::StageOrder order :
       {pipeline::StageOrder::stages_across_nodes, pipeline::StageOrder::stages_within_node}) {
    for (int stages = 1; stages <= nodes.world; ++stages) {
      if (nodes.world % stages != 0) continue;
      const auto topology = pipeline::make_pipeline_topology(nodes, stages, order);
      SCOPED_TRACE(topology.describe());
      const pipeline::PipelineGroups g = pipeline::make_pipeline_groups(world, topology);
      expect_members(*g.data_parallel.comm, topology.data_parallel_group(rank), rank);
      expect_members(*g.pipeline.comm, topology.pipeline_group(rank), rank);
      EXPECT_EQ(g.pipeline.comm->rank(), g.stage);
      // Forward: stage 0 sends its world rank; every later stage adds its own and passes it on.
      constexpr size_t kCount = 1000;
      std::vector<float> act(kCount, 0.0f);
      if (g.previous_peer >= 0) {
        g.pipeline.comm->recv(act.data(), kCount, DType::f32, g.previous_peer, 1)->wait();
      }
      for (size_t i = 0; i < kCount; ++i) act[i] += static_cast<float>(rank) + static_cast<float>(i);
      if (g.next_peer >= 0) g.pipeline.comm->send(act.data(), kCount, DType::f32, g.next_peer, 1)->wait();
      // What arrived is the sum of the world ranks of the stages so far (those of this data-parallel index).
      float so_far = 0;
      for (int s = 0; s <= g.stage; ++s) so_far += static_cast<float>(topology.rank_of(s, topology.index_of(rank)));
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(act[i], so_far + static_cast<float>(i) * static_cast<float>(g.stage + 1)) << "element " << i;
      }
      // Backward: the gradient comes back from the last stage, which sends 1; each stage doubles it.
      std::vector<float> grad(kCount, 1.0f);
      if (g.next_peer >= 0) g.pipeline.comm->recv(grad.data(), kCount, DType::f32, g.next_peer, 2)->wait();
      for (float& x : grad) x *= 2.0f;
      if (g.previous_peer >= 0) g.pipeline.comm->send(grad.data(), kCount, DType::f32, g.previous_peer, 2)->wait();
      EXPECT_EQ(grad[0], static_cast<float>(1 << (stages - g.stage)));
      EXPECT_EQ(g.previous_rank, g.stage > 0 ? topology.rank_of(g.stage - 1, topology.index_of(rank)) : -1);
      EXPECT_EQ(g.next_rank, g.stage + 1 < stages ? topology.rank_of(g.stage + 1, topology.index_of(rank)) : -1);
    }
  }
}

}  // namespace

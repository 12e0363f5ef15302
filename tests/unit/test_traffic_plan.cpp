// The traffic plan (zero3/traffic_plan.hpp): exact bytes for a crafted model on 2 nodes of 2 ranks under plain
// ZeRO-3, HSDP and hpZ. The engine's own counters are checked against the same function in
// tests/dist/test_equivalence_layouts.cpp.
#include <gtest/gtest.h>

#include "zero3/error.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3 {
namespace {

// Units of 30, 7, 28 and 101 elements; b (7) stays gathered.
ModelDesc crafted() {
  ModelDesc m;
  m.name = "crafted";
  m.units = {{"a", {{10, 3}}}, {"b", {{7}}}, {"c", {{5, 5}, {3}}}, {"d", {{101}}}};
  return m;
}

Config config() {
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.gradient_accumulation_steps = 2;
  c.zero.reduce_bucket_size = 40;
  c.zero.prefetch_bucket_size = 40;
  c.zero.param_persistence_threshold = 10;
  c.zero.max_reuse_distance = 0;  // every backward gathers again (but d, used twice in a row)
  return c;
}

TrafficPlanOptions two_nodes_of_two() {
  TrafficPlanOptions o;
  o.world_size = 4;
  o.ranks_per_node = 2;
  return o;
}

TEST(TrafficPlan, PlainZero3SendsEveryGatherAndReductionAcrossFromTheLastRankOfANode) {
  const TrafficPlan p = plan_traffic(crafted(), config(), two_nodes_of_two());
  EXPECT_EQ(p.nodes, 2);
  EXPECT_EQ(p.gradient_accumulation_steps, 2);
  ASSERT_EQ(p.ranks.size(), 4u);
  // Slices over 4: a 8, b 2, c 7, d 26. Per micro-step a and c are gathered twice, d once (forward, then its
  // backward comes next), b stays: (2 x 8 + 2 x 7 + 26) x 3 sends x 2 bytes, twice, less one gather of a (the
  // next micro-step's first unit within the window: kept from its backward); b once after the step.
  const int64_t gathers = (2 * (2 * 8 + 2 * 7 + 26) - 8) * 3 * 2 + 2 * 3 * 2;
  // Reduce-scatter of the 43 slice elements per micro-step, in buckets of min(40 / 4, 43) = 10.
  const int64_t reductions = 2 * 43 * 3 * 2;
  for (int r = 0; r < 4; ++r) {
    const RankTraffic& t = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(t.gathers.collectives, 2 * 5 - 1 + 1) << r;
    EXPECT_EQ(t.gathers.inter_node_collectives, 2 * 5 - 1 + 1) << r;
    EXPECT_EQ(t.reductions.collectives, 2 * 5) << r;  // ceil(43 / 10) buckets per micro-step
    const bool exit = r % 2 == 1;                     // the next rank of the world's ring is on the next node
    EXPECT_EQ(t.gathers.inter_node_bytes, exit ? gathers : 0) << r;
    EXPECT_EQ(t.gathers.intra_node_bytes, exit ? 0 : gathers) << r;
    EXPECT_EQ(t.reductions.inter_node_bytes, exit ? reductions : 0) << r;
  }
  // The parts a step-time model needs apart: b's re-gather after the step is the boundary, every gather reads the
  // primary partition (2 x (2 x 8 + 2 x 7 + 26) - 8 + 2 slice elements), and the slices total 43 elements.
  EXPECT_EQ(p.slice_elements, 43);
  for (int r = 0; r < 4; ++r) {
    const RankTraffic& t = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(t.boundary_gathers.collectives, 1) << r;
    EXPECT_EQ(t.boundary_gathers.inter_node_bytes + t.boundary_gathers.intra_node_bytes, 2 * 3 * 2) << r;
    EXPECT_EQ(t.boundary_reductions, CollectiveTraffic{}) << r;
    EXPECT_EQ(t.secondary_gathers, CollectiveTraffic{}) << r;
    EXPECT_EQ(t.primary_gather_elements, 2 * (2 * 8 + 2 * 7 + 26) - 8 + 2) << r;
  }
  EXPECT_EQ(p.node_inter_node_bytes(0), gathers + reductions);
  EXPECT_EQ(p.max_node_inter_node_bytes(), gathers + reductions);
  EXPECT_NE(format_traffic_plan(p).find("zero3 traffic plan: ZeRO-3 over 4 ranks, 2 micro-step(s)"), std::string::npos);
}

TEST(TrafficPlan, WithoutTheKeepAcrossMicroStepsEveryMicroStepGathersItsFirstUnit) {
  TrafficPlanOptions o = two_nodes_of_two();
  o.keep_first_units = false;  // DeepSpeed's flow
  const TrafficPlan p = plan_traffic(crafted(), config(), o);
  for (int r = 0; r < 4; ++r) {
    const RankTraffic& t = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(t.gathers.collectives, 2 * 5 + 1) << r;  // a gathered in both micro-steps
    EXPECT_EQ(t.primary_gather_elements, 2 * (2 * 8 + 2 * 7 + 26) + 2) << r;
  }
}

TEST(TrafficPlan, HsdpCrossesNodesOnlyForTheAllReduceAcrossReplicas) {
  Config c = config();
  c.zero.mics_shard_size = 2;
  const TrafficPlan p = plan_traffic(crafted(), c, two_nodes_of_two());
  EXPECT_EQ(p.layout, "MiCS: shard groups of 2 ranks (one node: HSDP) x 2 replicas");
  // Slices over 2: a 15, b 4, c 14, d 51 (84 in all). The replica all-reduce: buckets of min(40, 84) = 40, fills
  // 40, 40, 4, each floor(2 x 1 x fill / 2) elements of 2 bytes, by every rank (one per node in its group).
  for (int r = 0; r < 4; ++r) {
    const RankTraffic& t = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(t.gathers.inter_node_collectives, 0) << r;
    EXPECT_EQ(t.gathers.inter_node_bytes, 0) << r;
    EXPECT_EQ(t.gathers.intra_node_bytes, (2 * (2 * 15 + 2 * 14 + 51) - 15) * 2 + 4 * 2) << r;  // a kept once
    EXPECT_EQ(t.reductions.inter_node_collectives, 3) << r;
    EXPECT_EQ(t.reductions.inter_node_bytes, 84 * 2) << r;
    EXPECT_EQ(t.reductions.intra_node_bytes, 2 * 84 * 2) << r;  // reduce-scatter over 2, both micro-steps
    EXPECT_EQ(t.boundary_reductions.collectives, 3) << r;         // the all-reduce across replicas, once per step
    EXPECT_EQ(t.boundary_reductions.inter_node_bytes, 84 * 2) << r;
    EXPECT_EQ(t.boundary_reductions.intra_node_bytes, 0) << r;
  }
  EXPECT_EQ(p.slice_elements, 84);
  const TrafficPlan plain = plan_traffic(crafted(), config(), two_nodes_of_two());
  EXPECT_EQ(p.max_node_inter_node_bytes(), 2 * 84 * 2);  // 336 against plain ZeRO-3's 1152 per node
  EXPECT_EQ(plain.max_node_inter_node_bytes(), 1152);
}

TEST(TrafficPlan, HpzGathersTheFirstTimeOverEveryRankThenWithinTheNode) {
  Config c = config();
  c.zero.hpz_partition_size = 2;
  const TrafficPlan p = plan_traffic(crafted(), c, two_nodes_of_two());
  // a, c, d: 2 x (2, 2, 1) - 1 = 9 gathers a step (a, the first unit, is kept across the micro-steps of the window):
  // the first of each over the world (slices 8, 7, 26), the other 6 from the secondary partition within the node
  // (padded / 2: a 16, c 14, d 52); b once over the world after the step.
  for (int r = 0; r < 4; ++r) {
    const RankTraffic& t = p.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(t.gathers.collectives, 9 + 1) << r;
    EXPECT_EQ(t.gathers.inter_node_collectives, 3 + 1) << r;
    const int64_t world = (8 + 7 + 26 + 2) * 3 * 2;
    const int64_t secondary = (2 * 16 + 3 * 14 + 52) * 1 * 2;
    EXPECT_EQ(t.gathers.inter_node_bytes, r % 2 == 1 ? world : 0) << r;
    EXPECT_EQ(t.gathers.intra_node_bytes, (r % 2 == 1 ? 0 : world) + secondary) << r;
    EXPECT_EQ(t.secondary_gathers.collectives, 6) << r;
    EXPECT_EQ(t.secondary_gathers.intra_node_bytes, secondary) << r;
    EXPECT_EQ(t.secondary_gathers.inter_node_bytes, 0) << r;
    EXPECT_EQ(t.primary_gather_elements, 8 + 7 + 26 + 2) << r;
  }
}

TEST(TrafficPlan, RefusesNodesThatDoNotTileTheWorld) {
  TrafficPlanOptions o;
  o.world_size = 6;
  o.ranks_per_node = 4;
  EXPECT_THROW(plan_traffic(crafted(), config(), o), InvalidArgument);
  Config c = config();
  c.zero.mics_shard_size = 3;
  EXPECT_THROW(plan_traffic(crafted(), c, two_nodes_of_two()), ConfigError);
}

}  // namespace
}  // namespace zero3

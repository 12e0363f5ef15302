// The per-step traffic plan (src/zero/step_traffic.*): the bytes one rank sends per optimizer step, intra- and
// inter-node, under plain ZeRO-3, hpZ, MiCS (flat and hierarchical), qwZ and qgZ, on crafted models whose counts
// follow by hand from the ring formulas; the gather replay's reuse rule; and the errors.
#include <gtest/gtest.h>

#include <string>

#include "zero/step_traffic.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::detail;

namespace {

// Two units of 8 elements each: on 4 ranks slices of S = 2, on a shard group of 2, S = 4.
ModelDesc two_units() {
  ModelDesc m;
  m.name = "two";
  m.units = {{"a", {{8}}}, {"b", {{2, 4}}}};
  return m;
}

// bf16 compute, gradients reduced in bf16 (Config::communication_dtype's default), nothing persistent, one reduce
// bucket per micro-step. Reuse distance 0: every unit is gathered in forward and again in backward, but for the
// last one (b), whose backward scope comes right after its forward one (no elements in between) and which stays.
Config stage3_bf16() {
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.zero.reduce_bucket_size = 1000;
  c.zero.prefetch_bucket_size = 1000;
  c.zero.param_persistence_threshold = 0;
  c.zero.max_reuse_distance = 0;
  c.zero.max_live_parameters = 1000;
  return c;
}

ShardLayout layout_of(const Config& c, int world, int per_node) {
  return make_shard_layout(c.zero, make_node_layout(world, per_node, "test"));
}

StepTraffic plan(const Config& c, const ShardLayout& l, int rank, int ga = 2, StepTrafficOptions o = {}) {
  o.grad_accum = ga;
  return plan_step_traffic(two_units(), c, l, rank, o);
}

TEST(WireBytes, CodesPaddedToFourBytesPlusAScalePerBlock) {
  EXPECT_EQ(wire_bytes(10, 2, {}), 20);                     // not quantized: 10 bf16 elements
  EXPECT_EQ(wire_bytes(4096, 2, {8, 2048}), 4096 + 2 * 4);  // int8: a byte each, two fp32 scales
  EXPECT_EQ(wire_bytes(4096, 4, {4, 2048}), 2048 + 2 * 4);  // int4: two per byte
  EXPECT_EQ(wire_bytes(5, 2, {4, 2048}), 4 + 4);            // 3 code bytes padded to 4, one block
  EXPECT_EQ(wire_bytes(2049, 2, {8, 2048}), 2052 + 2 * 4);  // 2049 code bytes padded to 2052, two blocks
}

// Plain ZeRO-3 on 2 nodes x 2: rank 1's ring neighbour (rank 2) is on the other node, rank 0's (rank 1) on its own.
// A gather of S = 2 bf16 elements sends (4 - 1) * 2 * 2 = 12 bytes; each micro-step gathers both units in forward
// and unit a in backward, and reduce-scatters 2 + 2 elements: (4 - 1) * 4 * 2 = 24 bytes.
TEST(StepTraffic, PlainZero3) {
  Config c = stage3_bf16();
  ShardLayout l = layout_of(c, 4, 2);
  StepTraffic r1 = plan(c, l, 1);
  EXPECT_EQ(r1.forward_gathers.inter_node_bytes, 2 * 2 * 12);  // 2 micro-steps x 2 units
  EXPECT_EQ(r1.backward_gathers.inter_node_bytes, 2 * 12);
  EXPECT_EQ(r1.reductions.inter_node_bytes, 2 * 24);
  EXPECT_EQ(r1.reductions.collectives, 2);  // one bucket per micro-step
  EXPECT_EQ(r1.total().intra_node_bytes, 0);
  EXPECT_EQ(r1.total().collectives, 6 + 2);
  EXPECT_EQ(r1.total().inter_node_collectives, 8);
  EXPECT_EQ(r1.boundary, CollectiveTraffic{});
  EXPECT_EQ(r1.owned_elements, 4);
  EXPECT_EQ(r1.primary_slice_elements, 6 * 2);  // 6 gathers of a 2-element slice

  StepTraffic r0 = plan(c, l, 0);
  EXPECT_EQ(r0.total().intra_node_bytes, r1.total().inter_node_bytes);
  EXPECT_EQ(r0.total().inter_node_bytes, 0);

  // An fp32 reduction (communication_data_type) doubles the reduction bytes only.
  c.communication_data_type = DType::f32;
  EXPECT_EQ(plan(c, l, 1).reductions.inter_node_bytes, 2 * 48);
  EXPECT_EQ(plan(c, l, 1).forward_gathers.inter_node_bytes, 2 * 2 * 12);
}

// hpZ groups of one node: the first gather of each unit after the step (micro-step 0's forward) comes from the
// primary partition over all 4 ranks (12 bytes, across nodes for rank 1); every later gather from the secondary
// partition within the node: P / 2 = 4 elements, (2 - 1) * 4 * 2 = 8 bytes. Reductions stay over every rank.
TEST(StepTraffic, HpzGathersFromTheSecondaryPartitionAfterTheFirst) {
  Config c = stage3_bf16();
  c.zero.hpz_partition_size = 2;
  ShardLayout l = layout_of(c, 4, 2);
  ASSERT_EQ(l.kind, LayoutKind::hpz);
  StepTraffic r1 = plan(c, l, 1);
  EXPECT_EQ(r1.forward_gathers.inter_node_bytes, 2 * 12);  // micro-step 0, both units
  EXPECT_EQ(r1.forward_gathers.intra_node_bytes, 2 * 8);   // micro-step 1, both units
  EXPECT_EQ(r1.backward_gathers.inter_node_bytes, 0);
  EXPECT_EQ(r1.backward_gathers.intra_node_bytes, 2 * 8);  // unit a, both micro-steps
  EXPECT_EQ(r1.reductions.inter_node_bytes, 2 * 24);
  EXPECT_EQ(r1.primary_slice_elements, 2 * 2);
}

// MiCS with shard groups of one node (HSDP): gathers and reduce-scatters within the node, S = 4 over 2 ranks
// ((2 - 1) * 4 * 2 = 8 bytes a gather, 8 elements reduce-scattered a micro-step: 16 bytes); once per step the
// replicas all-reduce the 8 owned elements: floor(2 * (2 - 1) * 8 / 2) = 8 elements, 16 bytes, across nodes.
TEST(StepTraffic, MicsReducesAcrossReplicasOncePerStep) {
  Config c = stage3_bf16();
  c.zero.mics_shard_size = 2;
  ShardLayout l = layout_of(c, 4, 2);
  StepTraffic r1 = plan(c, l, 1);
  EXPECT_EQ(r1.forward_gathers.intra_node_bytes, 2 * 2 * 8);
  EXPECT_EQ(r1.backward_gathers.intra_node_bytes, 2 * 8);
  EXPECT_EQ(r1.reductions.intra_node_bytes, 2 * 16);
  EXPECT_EQ(r1.forward_gathers.inter_node_bytes + r1.backward_gathers.inter_node_bytes + r1.reductions.inter_node_bytes,
            0);
  EXPECT_EQ(r1.boundary.inter_node_bytes, 16);
  EXPECT_EQ(r1.boundary.collectives, 1);
  EXPECT_EQ(r1.owned_elements, 8);

  // Buckets of 3 elements: all-reduces of 3, 3 and 2 elements, each floor(2 * 1 * n / 2) = n elements.
  c.zero.reduce_bucket_size = 3;
  EXPECT_EQ(plan(c, layout_of(c, 4, 2), 1).boundary.collectives, 3);
  EXPECT_EQ(plan(c, layout_of(c, 4, 2), 1).boundary.inter_node_bytes, 16);
  // Over 3 replicas (6 ranks on 3 nodes), a bucket of 3 sends floor(2 * 2 * 3 / 3) = 4 elements, of 2: floor(8 / 3)
  // = 2: the ring formula rounds down per bucket, as the reducer's count does.
  EXPECT_EQ(plan(c, layout_of(c, 6, 2), 1).boundary.inter_node_bytes, (4 + 4 + 2) * 2);
}

// MiCS over 2 nodes of 2 ranks with hierarchical gathers, on 4 nodes: one unit of 16 elements, S = 4. Rank 1 first
// gathers between the nodes with ranks of its local rank in its shard group ([1, 3]: (2 - 1) * 4 * 2 = 8 bytes to
// node 1), then within its node once per node of the group (2 x 8 bytes).
TEST(StepTraffic, HierarchicalMicsGathersBetweenNodesThenWithin) {
  Config c = stage3_bf16();
  c.zero.mics_shard_size = 4;
  c.zero.mics_hierarchical_params_gather = true;
  ShardLayout l = layout_of(c, 8, 2);
  ModelDesc m;
  m.units = {{"u", {{16}}}};
  StepTrafficOptions o;
  o.grad_accum = 1;
  StepTraffic r1 = plan_step_traffic(m, c, l, 1, o);
  EXPECT_EQ(r1.forward_gathers.inter_node_bytes, 8);
  EXPECT_EQ(r1.forward_gathers.intra_node_bytes, 2 * 8);
  EXPECT_EQ(r1.forward_gathers.collectives, 3);
}

// qwZ: a gather sends S = 2 int8 codes padded to 4 bytes plus one fp32 scale: (4 - 1) * 8 = 24 bytes.
// qgZ (int4) on 2 nodes x 2: per unit and micro-step, an all-to-all within the node sends the one local peer
// the quantized P / 2 = 4 elements (2 code bytes padded to 4, plus a scale: 8 bytes), then one across the nodes
// sends the peer with rank 1's local rank S = 2 elements (8 bytes).
TEST(StepTraffic, QuantizedWeightsAndGradients) {
  Config c = stage3_bf16();
  ShardLayout l = layout_of(c, 4, 2);
  StepTrafficOptions o;
  o.weights = {8, 2048};
  o.gradients = {4, 2048};
  StepTraffic r1 = plan(c, l, 1, 2, o);
  EXPECT_EQ(r1.forward_gathers.inter_node_bytes, 2 * 2 * 24);
  EXPECT_EQ(r1.reductions.intra_node_bytes, 2 * 2 * 8);
  EXPECT_EQ(r1.reductions.inter_node_bytes, 2 * 2 * 8);
  EXPECT_EQ(r1.reductions.collectives, 2 * 2 * 2);
  EXPECT_EQ(r1.reductions.inter_node_collectives, 2 * 2);  // only the second stage's group spans nodes
  StepTraffic r0 = plan(c, l, 0, 2, o);
  EXPECT_EQ(r0.reductions.intra_node_bytes, 2 * 2 * 8);
  EXPECT_EQ(r0.reductions.inter_node_bytes, 2 * 2 * 8);
}

// A unit closing in forward stays gathered when its backward use comes within stage3_max_reuse_distance elements
// of other units' scopes: at 0 only unit b (used again right away), at 16 unit a too (b's 8 elements in forward
// and 8 in backward lie in between). Persistent units are gathered once per step, at the boundary.
TEST(StepTraffic, ReuseAndPersistence) {
  Config c = stage3_bf16();
  ShardLayout l = layout_of(c, 4, 2);
  EXPECT_EQ(plan(c, l, 1).backward_gathers.collectives, 2 * 1);
  c.zero.max_reuse_distance = 15;
  EXPECT_EQ(plan(c, l, 1).backward_gathers.collectives, 2 * 1);
  c.zero.max_reuse_distance = 16;
  EXPECT_EQ(plan(c, l, 1).backward_gathers.collectives, 0);
  EXPECT_EQ(plan(c, l, 1).forward_gathers.collectives, 2 * 2);

  c.zero.max_reuse_distance = 0;
  c.zero.param_persistence_threshold = 8;
  c.zero.model_persistence_threshold = 8;  // only unit a fits
  StepTraffic p = plan(c, l, 1);
  EXPECT_EQ(p.boundary.collectives, 1);
  EXPECT_EQ(p.boundary.inter_node_bytes, 12);
  EXPECT_EQ(p.forward_gathers.collectives, 2);  // unit b only
  EXPECT_EQ(p.backward_gathers.collectives, 0);
}

TEST(StepTraffic, Errors) {
  Config c = stage3_bf16();
  ShardLayout l = layout_of(c, 4, 2);
  auto message = [&](Config cc, int rank, StepTrafficOptions o) -> std::string {
    try {
      plan_step_traffic(two_units(), cc, l, rank, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  Config stage2 = c;
  stage2.zero.stage = 2;
  EXPECT_NE(message(stage2, 0, {}).find("zero_optimization.stage: 2"), std::string::npos);
  Config unresolved = c;
  unresolved.zero.prefetch_bucket_size.reset();
  EXPECT_NE(message(unresolved, 0, {}).find("stage3_prefetch_bucket_size: still \"auto\""), std::string::npos);
  EXPECT_NE(message(c, 4, {}).find("rank 4 is not a rank of 4 ranks on 2 nodes x 2"), std::string::npos);
  StepTrafficOptions bad;
  bad.gradients = {5, 2048};
  EXPECT_NE(message(c, 0, bad).find("quantized gradients have 5 bits"), std::string::npos);
  bad = {};
  bad.weights = {4, 2048};
  EXPECT_NE(message(c, 0, bad).find("quantized weights have 4 bits"), std::string::npos);
  bad = {};
  bad.grad_accum = 0;
  EXPECT_NE(message(c, 0, bad).find("grad_accum 0"), std::string::npos);
}

}  // namespace

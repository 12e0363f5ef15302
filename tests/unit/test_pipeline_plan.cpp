// The plans of a pipelined run (zero3/pipeline_plan.hpp) on a small Llama whose figures can be checked by hand:
// the activations each pipeline rank keeps in flight under 1F1B, GPipe and interleaved 1F1B, the bytes per stage
// boundary and which links they cross in both stage orders, each rank's ZeRO plans over its data-parallel group, the
// bubble in the step time, and bad input named.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "zero3/activation_plan.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/pipeline_plan.hpp"
#include "zero3/step_time_model.hpp"
#include "zero3/traffic_plan.hpp"

namespace zero3 {
namespace {

// 6 units: embed, layer.0 .. layer.3, head.
LlamaDims small_dims() {
  LlamaDims d;
  d.hidden_size = 64;
  d.intermediate_size = 128;
  d.num_hidden_layers = 4;
  d.num_attention_heads = 4;
  d.num_key_value_heads = 4;
  d.vocab_size = 256;
  return d;
}

struct Shape {
  int stages = 2;
  const char* schedule = "1f1b";
  int virtual_stages = 1;
  int micro_batches = 4;
  int world = 2;
  const char* order = "stages_across_nodes";
};

// Micro-batch 2, bf16, ZeRO-3, layers cut uniformly; resolved for the shape's world.
Config config_for(const Shape& s) {
  const std::string text = std::string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )") +
                           std::to_string(s.micro_batches) + R"(, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": 4096, "stage3_prefetch_bucket_size": 4096,
                            "stage3_param_persistence_threshold": 0},
      "pipeline": {"stages": )" +
                           std::to_string(s.stages) +
                           R"(, "partition": "uniform"},
      "zero3": {"pipeline_schedule": ")" +
                           s.schedule + R"(", "pipeline_virtual_stages": )" + std::to_string(s.virtual_stages) +
                           R"(, "pipeline_stage_order": ")" + s.order + R"("}})";
  Config c = parse_config(text, "pipeline-test.json");
  ResolveInputs in;
  in.world_size = s.world;
  resolve(c, in);
  return c;
}

constexpr int64_t kMicroBatch = 2, kSeq = 8;
// One micro-batch's residual stream (and boundary activation): 2 x 8 tokens x 64 x 2 bytes (bf16).
constexpr int64_t kStream = kMicroBatch * kSeq * 64 * 2;
// One layer's cache without checkpointing: n = 16 tokens x (qkv 192 + q 64 + hidden 64 + gate/up 256) x 2 bytes,
// plus rstd1, rstd2 (16 each) and the log-sum-exp (2 x 4 heads x 8) in fp32.
constexpr int64_t kLayerCache = 16 * (192 + 64 + 64 + 256) * 2 + (2 * 16 + 2 * 4 * 8) * 4;

ActivationEstimate small_activations() {
  ActivationOptions a;
  a.micro_batch = kMicroBatch;
  a.seq_len = kSeq;
  a.checkpointing = false;
  return estimate_activations(small_dims(), a);
}

PipelinePlanOptions plan_options(int world, int per_node) {
  PipelinePlanOptions o;
  o.world_size = world;
  o.ranks_per_node = per_node;
  o.boundary_numel = kMicroBatch * kSeq * 64;
  o.dims = small_dims();
  o.activations = small_activations();
  o.checkpointing = false;
  return o;
}

TEST(PipelinePlan, ActivationsInFlightByHand) {
  const ActivationEstimate e = small_activations();
  ASSERT_EQ(e.layer_inputs, 5 * kStream);      // (L + 1) streams
  ASSERT_EQ(e.layer_caches, 4 * kLayerCache);  // every layer's cache
  const ModelDesc model = llama_model_desc(small_dims());

  // 1F1B, 2 stages, 4 micro-batches: rank 0 holds 2 in flight, rank 1 one. Stage 0 is embed, layer.0, layer.1
  // (uniform), stage 1 layer.2, layer.3, head.
  const Config c = config_for({});
  const PipelinePlan p = plan_pipeline(model, c, plan_options(2, 1));
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(p.data_parallel, 1);
  const PipelineRankPlan& r0 = p.ranks[0];
  const PipelineRankPlan& r1 = p.ranks[1];
  EXPECT_EQ(r0.in_flight, 2);
  EXPECT_EQ(r1.in_flight, 1);
  // Rank 0: per micro-batch its own input stream and the two layers' outputs, two caches: 3 x 2048 + 2 x 18816.
  EXPECT_EQ(kStream, 2048);
  EXPECT_EQ(kLayerCache, 18816);
  EXPECT_EQ(r0.held_activation_bytes, 2 * (3 * kStream + 2 * kLayerCache));  // 87,552
  EXPECT_EQ(r0.held_activation_bytes, 87552);
  // Rank 1: two streams, two caches and the received activation.
  EXPECT_EQ(r1.held_activation_bytes, 2 * kStream + 2 * kLayerCache + kStream);  // 43,776
  EXPECT_EQ(r0.once_activation_bytes, e.workspace + e.unit_staging + e.attention + 2 * kStream);
  EXPECT_EQ(r1.once_activation_bytes, e.workspace + e.unit_staging + e.attention + e.loss_chunk + 2 * kStream);

  // Each rank's memory is its units' plan over its data-parallel group plus those activations.
  for (const PipelineRankPlan& r : p.ranks) {
    MemoryPlanOptions m;
    m.world_size = 1;
    m.ranks_per_node = 1;
    const MemoryPlan base = plan_memory(r.units, c, m);
    EXPECT_EQ(r.memory.rank_bytes(MemoryTier::device),
              base.rank_bytes(MemoryTier::device) + r.held_activation_bytes + r.once_activation_bytes);
    EXPECT_EQ(r.memory.rank_bytes(MemoryCategory::params), base.rank_bytes(MemoryCategory::params));
  }
  EXPECT_EQ(r0.units.units.size(), 3u);
  EXPECT_EQ(r0.decoder_layers, 2);
  EXPECT_TRUE(r0.first && !r0.last && !r1.first && r1.last);

  // GPipe keeps all 4 micro-batches on both ranks.
  Shape gpipe;
  gpipe.schedule = "gpipe";
  const PipelinePlan g = plan_pipeline(model, config_for(gpipe), plan_options(2, 1));
  EXPECT_EQ(g.ranks[0].in_flight, 4);
  EXPECT_EQ(g.ranks[0].held_activation_bytes, 4 * (3 * kStream + 2 * kLayerCache));  // 175,104
  EXPECT_EQ(g.ranks[1].held_activation_bytes, 4 * (3 * kStream + 2 * kLayerCache));
  // The worst rank decides: GPipe's first rank holds more than 1F1B's.
  EXPECT_GT(g.ranks[g.worst_rank()].memory.rank_bytes(MemoryTier::device),
            p.ranks[p.worst_rank()].memory.rank_bytes(MemoryTier::device));

  // 1F1B on 4 stages, rank r holds at most 4 - r micro-batches.
  Shape four;
  four.stages = 4;
  four.world = 4;
  const PipelinePlan f = plan_pipeline(model, config_for(four), plan_options(4, 1));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(f.ranks[static_cast<size_t>(r)].in_flight, 4 - r) << r;
}

TEST(PipelinePlan, BoundaryBytesAndTheLinksTheyCross) {
  const ModelDesc model = llama_model_desc(small_dims());
  // 2 nodes x 2 ranks, 2 stages, 4 micro-batches: 4 x 2048 bytes each way per boundary and data-parallel index.
  Shape s;
  s.world = 4;
  const Config across = config_for(s);
  const PipelinePlan p = plan_pipeline(model, across, plan_options(4, 2));
  EXPECT_EQ(p.boundary_bytes_per_step, 4 * kStream);
  EXPECT_EQ(p.boundary_bytes_per_step, 8192);
  EXPECT_EQ(p.data_parallel, 2);
  EXPECT_EQ(p.group_ranks_per_node, 2);   // a stage per node: ZeRO within the node
  EXPECT_NEAR(p.bubble, 1.0 / 5, 1e-12);  // (S - 1) / (m + S - 1)
  for (const PipelineRankPlan& r : p.ranks) {
    EXPECT_EQ(r.boundary_sent_bytes, 8192);        // activations forward from rank 0, gradients back from rank 1
    EXPECT_EQ(r.boundary_inter_node_bytes, 8192);  // every boundary crosses between the nodes
    TrafficPlanOptions t;
    t.world_size = 2;
    t.ranks_per_node = 2;
    const TrafficPlan alone = plan_traffic(r.units, across, t);
    ASSERT_EQ(r.traffic.ranks.size(), alone.ranks.size());
    for (size_t i = 0; i < alone.ranks.size(); ++i) {
      EXPECT_EQ(r.traffic.ranks[i].gathers, alone.ranks[i].gathers);
      EXPECT_EQ(r.traffic.ranks[i].reductions, alone.ranks[i].reductions);
    }
    for (const RankTraffic& rt : r.traffic.ranks) {
      EXPECT_EQ(rt.gathers.inter_node_bytes + rt.reductions.inter_node_bytes, 0);
      EXPECT_GT(rt.gathers.intra_node_bytes, 0);
    }
  }
  // Each node's link carries its two ranks' boundary bytes and nothing of ZeRO's.
  EXPECT_EQ(p.node_boundary_inter_node_bytes, (std::vector<int64_t>{16384, 16384}));
  EXPECT_EQ(p.node_inter_node_bytes, (std::vector<int64_t>{16384, 16384}));

  // stages_within_node: the boundaries stay on the node, each stage's ZeRO group spans both nodes.
  s.order = "stages_within_node";
  const Config within = config_for(s);
  const PipelinePlan w = plan_pipeline(model, within, plan_options(4, 2));
  EXPECT_EQ(w.group_ranks_per_node, 1);
  EXPECT_EQ(w.node_boundary_inter_node_bytes, (std::vector<int64_t>{0, 0}));
  TrafficPlanOptions t;
  t.world_size = 2;
  t.ranks_per_node = 1;
  int64_t node0 = 0;
  for (const PipelineRankPlan& r : w.ranks) {
    EXPECT_EQ(r.world_ranks, (std::vector<int64_t>{r.rank, r.rank + 2}));
    const RankTraffic& rt = plan_traffic(r.units, within, t).ranks[0];
    node0 += rt.gathers.inter_node_bytes + rt.reductions.inter_node_bytes;
  }
  EXPECT_GT(node0, 0);
  EXPECT_EQ(w.node_inter_node_bytes[0], node0);

  // Interleaved, 2 stages per rank: 3 boundaries (0-1, 1-2, 2-3), each rank sends 3 x 8192 per step.
  s.order = "stages_across_nodes";
  s.schedule = "interleaved_1f1b";
  s.virtual_stages = 2;
  const PipelinePlan i = plan_pipeline(model, config_for(s), plan_options(4, 2));
  EXPECT_EQ(i.bounds.size(), 5u);
  EXPECT_EQ(i.ranks[0].stages, (std::vector<int>{0, 2}));
  for (const PipelineRankPlan& r : i.ranks) EXPECT_EQ(r.boundary_sent_bytes, 3 * 8192);
  EXPECT_LT(i.bubble, p.bubble);
}

ClusterDesc small_cluster(int nodes, int gpus) {
  return parse_cluster_desc(R"({"name": "test", "nodes": )" + std::to_string(nodes) + R"(, "gpus_per_node": )" +
                                std::to_string(gpus) + R"(, "gpu_bf16_tflops": 1, "gpu_memory_gb_s": 100,
      "pcie_gb_s": 10, "nic_gbit_s": 8, "cpu_memory_gb_s": 10, "nvme_gb_s": 1, "matmul_efficiency": 0.5,
      "pcie_efficiency": 1, "nccl_link_efficiency": 1, "collective_efficiency": 0.5, "collective_overhead_ms": 2})",
                            "test-cluster.json");
}

TEST(PipelinePlan, StepTimeHasTheBubble) {
  const LlamaDims dims = small_dims();
  const ModelDesc model = llama_model_desc(dims);
  Shape s;
  s.stages = 4;
  s.world = 4;
  const Config c = config_for(s);
  const ClusterDesc cluster = small_cluster(4, 1);
  StepTimeOptions o;
  o.seq_len = kSeq;
  const PipelineStepTime t = model_pipeline_step_time(model, dims, c, cluster, o);
  EXPECT_NEAR(t.bubble, 3.0 / 7, 1e-12);  // 1F1B, 4 stages, 4 micro-batches
  ASSERT_EQ(t.ranks.size(), 4u);
  // The pipeline: m x the slowest schedule step / (1 - bubble) = 7 steps; then the slowest rank's boundary.
  EXPECT_NEAR(t.pipeline_s, 7 * t.time.micro_step_s, 1e-12);
  EXPECT_NEAR(t.time.step_s, t.pipeline_s + t.time.boundary_s, 1e-12);
  EXPECT_NEAR(t.time.step_fixed_s, t.pipeline_fixed_s + t.time.boundary_fixed_s, 1e-12);
  EXPECT_GE(t.time.step_fixed_s, t.time.step_s);  // 2 ms per call across nodes on top of the full link rate
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_LE(t.ranks[r].micro_step_s + t.transfer_s[r], t.time.micro_step_s + 1e-15);
    // A stage per node, one GPU each: every boundary crosses; 2048 bytes per micro-batch per direction at
    // 8 Gbit/s x 0.5 (the bandwidth reading): rank 0 and 3 send one way, the middle ones both.
    const double sends = (r == 0 || r == 3) ? 1 : 2;
    EXPECT_NEAR(t.transfer_s[r], sends * 2048 / 0.5e9, 1e-15) << r;
  }
  // The stages' FLOPs add up to the unpipelined run's per GPU (the same micro-batches through all the layers).
  Shape one = s;
  one.stages = 1;
  const StepTime whole = model_step_time(model, dims, config_for(one), cluster, o);
  double flops = 0;
  for (const StepTime& r : t.ranks) flops += r.flops_per_gpu;
  EXPECT_NEAR(flops, whole.flops_per_gpu, whole.flops_per_gpu * 1e-12);

  // More micro-batches, a smaller bubble; interleaved, smaller still.
  s.micro_batches = 16;
  const PipelineStepTime more = model_pipeline_step_time(model, dims, config_for(s), cluster, o);
  EXPECT_NEAR(more.bubble, 3.0 / 19, 1e-12);
  s.schedule = "interleaved_1f1b";
  s.virtual_stages = 2;
  s.stages = 2;
  s.world = 4;
  const PipelineStepTime interleaved = model_pipeline_step_time(model, dims, config_for(s), small_cluster(2, 2), o);
  s.schedule = "1f1b";
  s.virtual_stages = 1;
  const PipelineStepTime plain = model_pipeline_step_time(model, dims, config_for(s), small_cluster(2, 2), o);
  EXPECT_LT(interleaved.bubble, plain.bubble);
  EXPECT_FALSE(format_pipeline_step_time(t, 10).empty());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelinePlan, BadInputNamed) {
  const LlamaDims dims = small_dims();
  const ModelDesc model = llama_model_desc(dims);
  // Stages that do not divide the world: the resolver names them, and so does the plan for another world.
  Shape s;
  s.stages = 3;
  s.world = 4;
  EXPECT_NE(error_of([&] { config_for(s); }).find("pipeline.stages: 3 stages do not divide the world size 4"),
            std::string::npos);
  s.world = 6;
  const Config three = config_for(s);
  EXPECT_NE(error_of([&] {
              plan_pipeline(model, three, plan_options(4, 1));
            }).find("pipeline.stages: 3 stages do not divide the 4 ranks"),
            std::string::npos);
  // More stages than the model's 6 units, also through the virtual stages.
  s.stages = 8;
  s.world = 8;
  s.micro_batches = 8;
  const Config eight = config_for(s);
  EXPECT_NE(error_of([&] {
              plan_pipeline(model, eight, plan_options(8, 1));
            }).find("pipeline.stages: 8 stages for 6 layers; every stage needs at least one layer"),
            std::string::npos);
  s = Shape{};
  s.stages = 4;
  s.world = 4;
  s.schedule = "interleaved_1f1b";
  s.virtual_stages = 2;
  const Config virtual8 = config_for(s);
  EXPECT_NE(error_of([&] { plan_pipeline(model, virtual8, plan_options(4, 1)); }).find("8 stages for 6 layers"),
            std::string::npos);
  // A data-parallel group spread unevenly: 4 nodes x 3 ranks, 2 stages side by side on each node.
  s = Shape{};
  s.world = 12;
  s.order = "stages_within_node";
  const Config uneven = config_for(s);
  EXPECT_NE(error_of([&] {
              plan_pipeline(model, uneven, plan_options(12, 3));
            }).find("zero3.pipeline_stage_order: stages_within_node puts"),
            std::string::npos);
  // Tied embeddings cross the first and the last stage.
  LlamaDims tied = dims;
  tied.tie_word_embeddings = true;
  PipelinePlanOptions o = plan_options(2, 1);
  o.dims = tied;
  const Config two = config_for(Shape{});
  EXPECT_NE(error_of([&] { plan_pipeline(llama_model_desc(tied), two, o); }).find("ties its embeddings"),
            std::string::npos);
  // A schedule that needs more micro-batches than given is the resolver's error.
  s = Shape{};
  s.micro_batches = 1;
  EXPECT_NE(error_of([&] { config_for(s); }).find("gradient_accumulation_steps"), std::string::npos);
}

}  // namespace
}  // namespace zero3

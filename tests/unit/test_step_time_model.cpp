// The cluster description (zero3/cluster_desc.hpp) and the step-time model (zero3/step_time_model.hpp): the
// reader's errors, the rates it derives, the model's arithmetic on a crafted Llama whose FLOPs, bytes and times
// follow by hand, DeepSpeed's data flow beside zero3's, and `zero3 plan --cluster` end to end with the committed
// g6e.12xlarge descriptions against the seed's measured DeepSpeed runs (docs/performance-model.md); the fixed-cost
// reading of the network, the fit of both readings to a measured run, and the descriptions' fit to the EFA run alone.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "support/run_command.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/step_time_model.hpp"

namespace zero3 {
using testing::run_command;

namespace {

const char* kCluster = R"({
  // every figure named
  "name": "test",
  "nodes": 2, "gpus_per_node": 2,
  "gpu_bf16_tflops": 1e-9, "gpu_memory_gb_s": 1e-7, "pcie_gb_s": 2e-7, "nic_gbit_s": 8e-7,
  "cpu_memory_gb_s": 1e-7, "nvme_gb_s": 1e-7,
  "matmul_efficiency": 1, "pcie_efficiency": 1, "nccl_link_efficiency": 1, "collective_efficiency": 1
})";

std::string cluster_error(const std::string& text) {
  try {
    parse_cluster_desc(text, "c.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// kCluster with one field set to `value` (JSON text), or removed when `value` is empty.
std::string with(const std::string& field, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(kCluster, nullptr, true, /*ignore_comments=*/true);
  if (value.empty()) {
    j.erase(field);
  } else {
    j[field] = nlohmann::json::parse(value);
  }
  return j.dump();
}

TEST(ClusterDesc, ReadsEveryFigureAndDerivesTheRates) {
  ClusterDesc c = parse_cluster_desc(kCluster, "c.json");
  EXPECT_EQ(c.name, "test");
  EXPECT_EQ(c.world(), 4);
  EXPECT_DOUBLE_EQ(c.inter_node_gb_s(), 1e-7);  // 8e-7 Gbit/s / 8
  EXPECT_DOUBLE_EQ(c.pcie_effective_gb_s(), 2e-7);

  ClusterDesc g;
  g.nic_gbit_s = 100;
  g.nccl_link_efficiency = 0.8;
  g.collective_efficiency = 0.5;
  g.pcie_gb_s = 32;
  g.pcie_efficiency = 0.8;
  EXPECT_DOUBLE_EQ(g.inter_node_gb_s(), 5.0);
  EXPECT_DOUBLE_EQ(g.pcie_effective_gb_s(), 25.6);
  g.flow_limit_gbit_s = 5;
  g.flows_per_node = 2;  // 10 Gbit/s of flows under a 100 Gbit/s NIC
  EXPECT_DOUBLE_EQ(g.link_capacity_gbit_s(), 10.0);
  EXPECT_DOUBLE_EQ(g.inter_node_gb_s(), 0.5);
  g.flows_per_node = 32;  // 160 Gbit/s of flows: the NIC is the cap
  EXPECT_DOUBLE_EQ(g.link_capacity_gbit_s(), 100.0);
}

TEST(ClusterDesc, NamesTheFieldOfEveryBadFigure) {
  EXPECT_NE(cluster_error(with("nic_gbit_s", "")).find("c.json: nic_gbit_s: missing"), std::string::npos);
  EXPECT_NE(cluster_error(with("pcie_gb_s", "-3")).find("c.json: pcie_gb_s: -3 is not a positive rate"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("nvme_gb_s", "0")).find("nvme_gb_s: 0 is not a positive rate"), std::string::npos);
  EXPECT_NE(cluster_error(with("collective_efficiency", "1.5")).find("collective_efficiency: 1.5 is not a fraction"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("nodes", "2.5")).find("nodes: 2.5 is not a positive whole number"), std::string::npos);
  EXPECT_NE(cluster_error(with("gpus_per_node", "0")).find("gpus_per_node: 0 is not a positive whole number"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("nodes", "10000000000")).find("nodes: 10000000000 is not a positive whole number"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("gpu_bf16_tflops", "\"fast\"")).find("gpu_bf16_tflops: expected a number"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("nic_gbit", "100")).find("unknown field \"nic_gbit\"; did you mean \"nic_gbit_s\"?"),
            std::string::npos);
  EXPECT_NE(cluster_error(with("flow_limit_gbit_s", "5")).find("flows_per_node: missing"), std::string::npos);
  EXPECT_NE(cluster_error(with("flows_per_node", "2")).find("flow_limit_gbit_s: missing"), std::string::npos);
  EXPECT_NE(cluster_error(with("pcie_efficiency", "0")).find("pcie_efficiency: 0 is not a fraction"),
            std::string::npos);
  std::string infinite = kCluster;
  infinite.replace(infinite.find("8e-7"), 4, "1e999");  // JSON text whose number overflows a double
  EXPECT_NE(cluster_error(infinite).find("c.json: not valid JSON"), std::string::npos);
  EXPECT_NE(cluster_error(infinite).find("1e999"), std::string::npos);
  EXPECT_NE(cluster_error(with("name", "4")).find("name: expected a string"), std::string::npos);
  EXPECT_EQ(cluster_error(with("nodes", "1000")), "");  // 2000 GPUs
  EXPECT_NE(cluster_error(with("nodes", "1000000")).find("gpus_per_node: 2 on 1000000 nodes make 2000000 GPUs"),
            std::string::npos);
  // Every figure the model uses is required, each named when missing.
  for (const char* field :
       {"nodes", "gpus_per_node", "gpu_bf16_tflops", "gpu_memory_gb_s", "pcie_gb_s", "nic_gbit_s", "cpu_memory_gb_s",
        "nvme_gb_s", "matmul_efficiency", "pcie_efficiency", "nccl_link_efficiency", "collective_efficiency"}) {
    EXPECT_NE(cluster_error(with(field, "")).find(std::string("c.json: ") + field + ": missing"), std::string::npos)
        << field;
  }
  EXPECT_NE(cluster_error("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(cluster_error("{").find("not valid JSON"), std::string::npos);
  EXPECT_THROW(load_cluster_desc("/nonexistent/cluster.json"), ConfigError);
}

// A Llama of hidden 4, one layer, one head, ffn 4, vocab 8, untied: units embed 32, layer 120 (q, k, v, o, gate,
// up, down 16 each, two norms of 4), head 36 (norm 4, lm_head 32): 188 elements, 156 of them in matrices used as
// matmuls (all but the embedding table). On 2 nodes x 2 ranks, slices of 8, 30 and 9: 47 owned elements a rank.
LlamaDims tiny_dims() {
  LlamaDims d;
  d.hidden_size = 4;
  d.intermediate_size = 4;
  d.num_hidden_layers = 1;
  d.num_attention_heads = 1;
  d.vocab_size = 8;
  return d;
}

Config tiny_config() {
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.zero.reduce_bucket_size = 1000;
  // No prefetch: nothing is gathered ahead, nor kept across the micro-steps of the window (the next test keeps),
  // so the hand arithmetic below counts every unit twice a micro-step in both flows.
  c.zero.prefetch_bucket_size = 0;
  c.zero.param_persistence_threshold = 0;
  c.zero.max_reuse_distance = -1;  // nothing stays gathered for backward: every unit gathered twice a micro-step
  c.zero.max_live_parameters = 1000;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 2;
  return c;
}

// Hand arithmetic, per micro-step:
//   FLOPs: a token's forward is 2 x 156 + 4 x context (seq 3: (3 + 1) / 2 = 2) x 4 (q width) x 1 layer = 344;
//     training 3 x 344 x 6 tokens (micro-batch 2 x seq 3) = 6192 FLOPs, at 1000 FLOP/s: 6.192 s.
//   Node link: rank 1 (ring neighbour on node 1) sends 3 x 47 x 2 bytes in each of the two gathers of every unit
//     and 3 x 47 x 2 in the reduce-scatter: 846 bytes, at 100 B/s: 8.46 s. Rank 0 sends the same within the node,
//     at 200 B/s over PCIe: 4.23 s. The micro-step is the node link's: 8.46 s.
//   Boundary: Adam on the GPU, 47 x 30 bytes at 100 B/s: 14.1 s. Step: 2 x 8.46 + 14.1 = 31.02 s.
TEST(StepTimeModel, HandComputedStep) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  ASSERT_EQ(m.numel(), 188);
  StepTimeOptions o;
  o.seq_len = 3;
  StepTime t = model_step_time(m, tiny_dims(), tiny_config(), cl, o);
  EXPECT_EQ(t.layout, "ZeRO-3 over 4 ranks");
  EXPECT_EQ(t.tokens_per_gpu, 12);
  EXPECT_DOUBLE_EQ(t.flops_per_gpu, 2 * 6192.0);
  EXPECT_NEAR(t.compute_s, 6.192, 1e-9);
  EXPECT_EQ(t.node_inter_bytes, 2 * 846);
  EXPECT_EQ(t.cluster_inter_bytes, 2 * 2 * 846);  // node 1's rank 3 sends to rank 0 as much
  EXPECT_EQ(t.gpu_intra_bytes, 2 * 846);
  EXPECT_NEAR(t.inter_node_s, 8.46, 1e-9);
  EXPECT_NEAR(t.intra_node_s, 4.23, 1e-9);
  EXPECT_EQ(t.offload_s, 0);
  EXPECT_NEAR(t.micro_step_s, 8.46, 1e-9);
  EXPECT_EQ(t.bound, "inter-node");
  EXPECT_NEAR(t.optimizer_s, 14.1, 1e-9);
  EXPECT_NEAR(t.boundary_s, 14.1, 1e-9);
  EXPECT_NEAR(t.step_s, 31.02, 1e-9);

  // A GPU 10 times slower makes the step compute-bound: 61.92 s a micro-step.
  cl.gpu_bf16_tflops = 1e-10;
  t = model_step_time(m, tiny_dims(), tiny_config(), cl, o);
  EXPECT_EQ(t.bound, "compute");
  EXPECT_NEAR(t.step_s, 2 * 61.92 + 14.1, 1e-9);
}

// The fixed-cost reading of the same step (collective_overhead_ms 1000: a second per collective that crosses
// nodes): every collective of the tiny job runs over all 4 ranks, which span both nodes: per micro-step 6 gathers
// and 1 reduce-scatter (one bucket of 47 elements), 14 a step. The node link at NCCL's rate, 100 B/s here as the
// factors are 1: (1692 bytes / 100 + 14 x 1 s) / 2 = 15.46 s a micro-step; step 2 x 15.46 + 14.1 = 45.02 s. The
// range is [31.02, 45.02]; a collective_efficiency of 0.5 halves the bandwidth reading's rate, not the other's.
TEST(StepTimeModel, FixedCostReading) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  StepTimeOptions o;
  o.seq_len = 3;
  StepTime t = model_step_time(m, tiny_dims(), tiny_config(), cl, o);
  EXPECT_FALSE(t.has_fixed_cost);  // no collective_overhead_ms: one reading
  EXPECT_EQ(t.step_fixed_s, t.step_s);
  EXPECT_EQ(t.inter_node_collectives, 14);
  cl.collective_overhead_ms = 1000;
  t = model_step_time(m, tiny_dims(), tiny_config(), cl, o);
  EXPECT_TRUE(t.has_fixed_cost);
  EXPECT_NEAR(t.inter_node_fixed_s, 15.46, 1e-9);
  EXPECT_NEAR(t.micro_step_fixed_s, 15.46, 1e-9);
  EXPECT_EQ(t.bound_fixed, "inter-node");
  EXPECT_NEAR(t.step_fixed_s, 45.02, 1e-9);
  EXPECT_NEAR(t.step_low_s(), 31.02, 1e-9);
  EXPECT_NEAR(t.step_high_s(), 45.02, 1e-9);
  cl.collective_efficiency = 0.5;
  t = model_step_time(m, tiny_dims(), tiny_config(), cl, o);
  EXPECT_NEAR(t.step_s, 2 * 16.92 + 14.1, 1e-9);
  EXPECT_NEAR(t.step_fixed_s, 45.02, 1e-9);
  const std::string table = format_step_times({"zero3"}, {t}, 10);
  EXPECT_NE(table.find("step, low-high                              45.02-47.94 s"), std::string::npos) << table;
  EXPECT_NE(table.find("10 steps, low-high                          450-479 s"), std::string::npos) << table;
  EXPECT_EQ(format_seconds_range(2, 2.001), "2.00 s");
  EXPECT_EQ(format_seconds_range(0.5, 120), "0.500-120 s");
}

// fit_network() finds the factors that produced a step: the bandwidth reading's collective_efficiency and the
// fixed-cost reading's collective_overhead_ms, each from DeepSpeed's flow; neither when the step is faster than
// the link at full rate.
TEST(StepTimeModel, FitNetworkRecoversTheFactors) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  StepTimeOptions o;
  o.seq_len = 3;
  o.flow = DataFlow::deepspeed;
  ClusterDesc truth = cl;
  truth.collective_efficiency = 0.4;
  truth.collective_overhead_ms = 250;
  const StepTime t = model_step_time(m, tiny_dims(), tiny_config(), truth, o);
  NetworkFit fit = fit_network(m, tiny_dims(), tiny_config(), cl, o, t.step_s);
  ASSERT_TRUE(fit.collective_efficiency.has_value());
  EXPECT_NEAR(*fit.collective_efficiency, 0.4, 1e-9);
  fit = fit_network(m, tiny_dims(), tiny_config(), cl, o, t.step_fixed_s);
  ASSERT_TRUE(fit.collective_overhead_ms.has_value());
  EXPECT_NEAR(*fit.collective_overhead_ms, 250, 1e-6);
  EXPECT_DOUBLE_EQ(fit.measured_step_s, t.step_fixed_s);
  EXPECT_DOUBLE_EQ(fit.modelled.step_s, 31.02);                 // the description's own reading
  fit = fit_network(m, tiny_dims(), tiny_config(), cl, o, 20);  // below 31.02 s, the link at full rate
  EXPECT_FALSE(fit.collective_efficiency.has_value());
  EXPECT_FALSE(fit.collective_overhead_ms.has_value());
  EXPECT_THROW(fit_network(m, tiny_dims(), tiny_config(), cl, o, -1), InvalidArgument);
}

// With prefetch (a bucket of 1000 elements holds the whole order), zero3 keeps the next micro-step's first units,
// here all three, from the first micro-step's backward into the second (docs/gpu.md, "Prefetch across the
// micro-step boundary"): that micro-step gathers each unit once (its backward), so a step sends 3 x 282 bytes of
// gathers (2 for the first micro-step, 1 for the second) and 2 x 282 of reduce-scatters: 1410 bytes over the node
// link, 7.05 s a micro-step. DeepSpeed releases every unit at a micro-step's end: 2 x 846.
TEST(StepTimeModel, Zero3KeepsTheFirstUnitsWithinTheWindow) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  Config c = tiny_config();
  c.zero.prefetch_bucket_size = 1000;
  StepTimeOptions o;
  o.seq_len = 3;
  const StepTime z = model_step_time(m, tiny_dims(), c, cl, o);
  EXPECT_EQ(z.node_inter_bytes, 5 * 282);
  EXPECT_NEAR(z.inter_node_s, 7.05, 1e-9);
  EXPECT_NEAR(z.step_s, 2 * 7.05 + 14.1, 1e-9);
  o.flow = DataFlow::deepspeed;
  EXPECT_EQ(model_step_time(m, tiny_dims(), c, cl, o).node_inter_bytes, 2 * 846);
}

// offload_optimizer and offload_param on cpu. zero3: each of the 12 gathers a step (6 a micro-step, all from the
// primary partition) brings the rank's slice up first (2 x (8 + 30 + 9) x 2 bytes... = 12 gathers' slices: 2 x 2 x
// 47 elements x 2 bytes = 376 bytes up); the step brings the fp32 accumulator down once (47 x 4 = 188 bytes) and
// writes the new parameters in host memory. DeepSpeed: the same parameter copies, plus every micro-step each
// reduced bf16 partition down and back up (47 x 2 bytes each way), plus 47 x 4 bytes down at the boundary.
// CPU Adam on the node's 94 owned parameters, 30 bytes each at 100 B/s: 28.2 s.
TEST(StepTimeModel, OffloadCopiesOfEachDataFlow) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  Config c = tiny_config();
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  c.zero.offload_param.device = OffloadDevice::cpu;
  StepTimeOptions o;
  o.seq_len = 3;
  StepTime z = model_step_time(m, tiny_dims(), c, cl, o);
  EXPECT_EQ(z.gpu_h2d_bytes, 376);
  EXPECT_EQ(z.gpu_d2h_bytes, 188);
  EXPECT_NEAR(z.offload_s, 376.0 / 2 / 200, 1e-9);
  EXPECT_NEAR(z.optimizer_s, 28.2, 1e-9);
  EXPECT_NEAR(z.step_offload_s, 188.0 / 200, 1e-9);
  EXPECT_NEAR(z.boundary_s, 28.2, 1e-9);

  o.flow = DataFlow::deepspeed;
  StepTime d = model_step_time(m, tiny_dims(), c, cl, o);
  EXPECT_EQ(d.gpu_h2d_bytes, 376 + 2 * 94);
  EXPECT_EQ(d.gpu_d2h_bytes, 2 * 94 + 188);
  EXPECT_NEAR(d.offload_s, (376.0 + 188) / 2 / 200, 1e-9);
  EXPECT_EQ(d.node_inter_bytes, z.node_inter_bytes);  // bf16 reductions in both (DeepSpeed's default dtype)

  // DeepSpeed's grad_accum_dtype fp32: its partitions travel as fp32.
  c.grad_accum_dtype = DType::f32;
  d = model_step_time(m, tiny_dims(), c, cl, o);
  EXPECT_EQ(d.gpu_d2h_bytes, 2 * 188 + 188);
}

// ZeRO++ from the config's keys: the model's bytes are plan_traffic()'s count of the quantized messages the engine
// sends, per step of 2 micro-steps on the tiny Llama (slices of 8, 30 and 9 elements over 4 ranks on 2 nodes x 2,
// 2048-element blocks: one fp32 scale per message):
//   qwZ: a slice of n elements travels as quant_message_bytes(n, int8) = n rounded up to 4, plus 4 bytes: 12, 36
//        and 16, 64 bytes a round of gathers against 94 in bf16. Rank 1 (ring neighbour on node 1) sends 3 x 64 per
//        round, 4 rounds a step: 768 bytes across nodes; its bf16 reductions (564 bytes) stay. Node 0: 1332 bytes.
//   qgZ: one bucket of f = 47 elements a micro-step; an all-to-all within the node of int4 messages of 2 x 47
//        elements (47 bytes of codes, 48 with padding, + 4: 52 bytes to the one local peer) and one across the
//        nodes of 47 elements (24 + 4 = 28 bytes to the one peer on the other node). Every rank sends across now:
//        node 0's link carries 2 ranks x 2 micro-steps x 28 = 112 bytes of reductions.
TEST(StepTimeModel, ZeroPlusPlusFromTheEnginesAccounting) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  StepTimeOptions o;
  o.seq_len = 3;
  Config qwz = tiny_config();
  qwz.zero.quantized_weights = true;
  StepTime w = model_step_time(m, tiny_dims(), qwz, cl, o);
  EXPECT_EQ(w.node_inter_bytes, 768 + 564);
  EXPECT_EQ(w.layout, "ZeRO-3 over 4 ranks + qwZ");
  Config both = qwz;
  both.zero.quantized_gradients = true;
  StepTime wg = model_step_time(m, tiny_dims(), both, cl, o);
  EXPECT_EQ(wg.layout, "ZeRO-3 over 4 ranks + qwZ + qgZ");
  EXPECT_EQ(wg.node_inter_bytes, 768 + 2 * 2 * 28);
  EXPECT_EQ(wg.cluster_inter_bytes, 2 * (768 + 2 * 2 * 28));
  EXPECT_EQ(wg.gpu_intra_bytes, 768 + 2 * 52);  // rank 0: its gathers' ring neighbour is on its node
  Config qgz = tiny_config();
  qgz.zero.quantized_gradients = true;
  EXPECT_EQ(model_step_time(m, tiny_dims(), qgz, cl, o).node_inter_bytes, 1128 + 2 * 2 * 28);
  // The block sizes are the config's: blocks of 2 elements give 5 scales to a slice of 9 elements (12 + 20 bytes).
  Config small_blocks = qwz;
  small_blocks.zero3.qwz_block_size = 2;
  EXPECT_EQ(model_step_time(m, tiny_dims(), small_blocks, cl, o).node_inter_bytes,
            4 * 3 * ((8 + 16) + (32 + 60) + (12 + 20)) + 564);

  // hpZ: only the first gather of each unit after the step reads the primary partition: one round, 3 x 64 = 192
  // bytes with qwZ (282 in bf16), across nodes from rank 1, within from rank 0. The other 3 gathers of each unit
  // read the secondary partition within the node, quantized too (as DeepSpeed's): chunks of 16, 60 and 18 elements,
  // messages of 20, 64 and 24 bytes, 3 x 108 = 324 bytes (564 in bf16); rank 0's reductions (564) stay on its node.
  Config hpz = tiny_config();
  hpz.zero.hpz_partition_size = 2;
  StepTime h16 = model_step_time(m, tiny_dims(), hpz, cl, o);
  hpz.zero.quantized_weights = true;
  StepTime h = model_step_time(m, tiny_dims(), hpz, cl, o);
  EXPECT_EQ(h16.node_inter_bytes, 282 + 564);
  EXPECT_EQ(h.node_inter_bytes, 192 + 564);
  EXPECT_EQ(h16.gpu_intra_bytes, 282 + 564 + 564);
  EXPECT_EQ(h.gpu_intra_bytes, 192 + 324 + 564);
}

// DeepSpeed's flow is plain ZeRO-3 whatever the layout and quantization keys say; zero3's follows them.
TEST(StepTimeModel, DeepSpeedFlowIgnoresLayoutKeys) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  Config c = tiny_config();
  c.zero.mics_shard_size = 2;
  c.zero.quantized_gradients = true;
  StepTimeOptions o;
  o.seq_len = 3;
  StepTime z = model_step_time(m, tiny_dims(), c, cl, o);
  o.flow = DataFlow::deepspeed;
  StepTime d = model_step_time(m, tiny_dims(), c, cl, o);
  EXPECT_EQ(d.layout, "ZeRO-3 over 4 ranks");
  EXPECT_NE(z.layout, d.layout);
  EXPECT_EQ(d.node_inter_bytes, 2 * 846);
  EXPECT_LT(z.node_inter_bytes, d.node_inter_bytes / 4);  // MiCS: only the replicas' all-reduce leaves the node
  EXPECT_GT(z.boundary_comm_s, 0);
}

TEST(StepTimeModel, Errors) {
  ClusterDesc cl = parse_cluster_desc(kCluster, "c.json");
  ModelDesc m = llama_model_desc(tiny_dims(), "tiny");
  auto message = [&](const Config& c, const StepTimeOptions& o, const LlamaDims& d) -> std::string {
    try {
      model_step_time(m, d, c, cl, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  StepTimeOptions o;
  o.seq_len = 3;
  StepTimeOptions no_seq;
  EXPECT_NE(message(tiny_config(), no_seq, tiny_dims()).find("seq_len 0"), std::string::npos);
  EXPECT_NE(message(tiny_config(), o, LlamaDims{}).find("Llama dimensions"), std::string::npos);
  Config auto_batch = tiny_config();
  auto_batch.train_micro_batch_size_per_gpu.reset();
  EXPECT_NE(message(auto_batch, o, tiny_dims()).find("train_micro_batch_size_per_gpu: still \"auto\""),
            std::string::npos);
  Config stage2 = tiny_config();
  stage2.zero.stage = 2;
  EXPECT_NE(message(stage2, o, tiny_dims()).find("zero_optimization.stage: 2"), std::string::npos);
  Config mics3 = tiny_config();
  mics3.zero.mics_shard_size = 3;
  EXPECT_NE(message(mics3, o, tiny_dims()).find("mics_shard_size"), std::string::npos);
  // ZeRO++ as the engine checks it: 16-bit compute, an even qgZ block.
  Config fp32_qwz = tiny_config();
  fp32_qwz.bf16.enabled = false;
  fp32_qwz.zero.quantized_weights = true;
  EXPECT_NE(message(fp32_qwz, o, tiny_dims()).find("zero_optimization.zero_quantized_weights: got true with fp32"),
            std::string::npos);
  Config odd_block = tiny_config();
  odd_block.zero.quantized_gradients = true;
  odd_block.zero3.qgz_block_size = 3;
  EXPECT_NE(message(odd_block, o, tiny_dims()).find("zero3.qgz_block_size: got 3"), std::string::npos);
}

// The value in the "50 steps" row of a column ("2554 s").
std::vector<double> fifty_steps(const std::string& out) {
  std::vector<double> v;
  std::smatch m;
  std::regex row("\\n50 steps +([0-9.]+) s +([0-9.]+) s");
  if (std::regex_search(out, m, row)) v = {std::stod(m[1]), std::stod(m[2])};
  return v;
}

// `zero3 plan --cluster` with the committed descriptions, the seed's config and Llama-3-8B at sequence length 512:
// the model's DeepSpeed flow lands within 25% of the seed's 50-step times (2441 s over EFA, 5409 s over TCP), and
// bad input ends with the usage or the named field.
TEST(StepTimeModel, PlanCommandReproducesTheSeedRuns) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  if (!bin || !src) GTEST_SKIP() << "ZERO3_BIN_DIR / ZERO3_SOURCE_DIR are not set (run through ctest)";
  const std::string base = std::string(bin) + "/zero3 plan --model " + src +
                           "/configs/models/llama-3-8b.json --config " + src +
                           "/configs/llama-3-8b-stage3.json --seq-len 512 --micro-batch 4 --grad-accum 4 --steps 50";
  const std::pair<const char*, double> runs[] = {{"efa", 2441.04}, {"tcp", 5408.85}};
  for (const auto& [name, measured] : runs) {
    int status = 0;
    std::string out =
        run_command(base + " --layouts --cluster " + src + "/configs/clusters/g6e-12xlarge-" + name + ".json 2>&1", &status);
    ASSERT_EQ(status, 0) << out;
    std::vector<double> t = fifty_steps(out);
    ASSERT_EQ(t.size(), 2u) << out;
    EXPECT_NEAR(t[0] / measured, 1.0, 0.25) << name << ": DeepSpeed's flow predicted " << t[0] << " s\n" << out;
    EXPECT_NE(out.find("hpZ + qwZ + qgZ (ZeRO++)"), std::string::npos) << out;
  }
  int status = 0;
  run_command(base + " --cluster /nonexistent.json 2>/dev/null", &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  run_command(std::string(bin) + "/zero3 plan --model x --config y --cluster z 2>/dev/null", &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);  // usage: no --seq-len
  run_command(base + " --world-size 16 --cluster z 2>/dev/null", &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);  // the cluster sets the world
}

// The g6e.12xlarge descriptions carry the network factors fitted to the seed's EFA run alone (2441.04 s for 50
// steps); the TCP description shares them, so its run (5408.85 s) is an out-of-sample check, whose errors
// docs/performance-model.md gives: -12.4% by the bandwidth reading, -39.3% by the fixed-cost one.
TEST(StepTimeModel, TheSeedClusterIsFittedToTheEfaRunAlone) {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  int64_t hidden = 0;
  LlamaDims dims;
  const ModelDesc m = load_model_desc(std::string(src) + "/configs/models/llama-3-8b.json", &hidden, &dims);
  Config c = load_config(std::string(src) + "/configs/llama-3-8b-stage3.json");
  ResolveInputs in;
  in.world_size = 16;
  in.hidden_size = hidden;
  in.micro_batch = 4;
  in.grad_accum = 4;
  resolve(c, in);
  const ClusterDesc efa = load_cluster_desc(std::string(src) + "/configs/clusters/g6e-12xlarge-efa.json");
  const ClusterDesc tcp = load_cluster_desc(std::string(src) + "/configs/clusters/g6e-12xlarge-tcp.json");
  StepTimeOptions o;
  o.seq_len = 512;
  const NetworkFit fit = fit_network(m, dims, c, efa, o, 2441.04 / 50);
  ASSERT_TRUE(fit.collective_efficiency && fit.collective_overhead_ms);
  EXPECT_NEAR(efa.collective_efficiency, *fit.collective_efficiency, 5e-5);  // the files keep 4 digits
  EXPECT_NEAR(efa.collective_overhead_ms, *fit.collective_overhead_ms, 5e-3);
  EXPECT_EQ(tcp.collective_efficiency, efa.collective_efficiency);
  EXPECT_EQ(tcp.collective_overhead_ms, efa.collective_overhead_ms);
  const NetworkFit check = fit_network(m, dims, c, tcp, o, 5408.85 / 50);
  EXPECT_NEAR((check.modelled.step_s / check.measured_step_s - 1) * 100, -12.4, 0.05);
  EXPECT_NEAR((check.modelled.step_fixed_s / check.measured_step_s - 1) * 100, -39.3, 0.05);
  // The TCP run alone would want a lower efficiency and a larger overhead: the two runs disagree.
  EXPECT_LT(*check.collective_efficiency, efa.collective_efficiency);
  EXPECT_GT(*check.collective_overhead_ms, efa.collective_overhead_ms);
}

}  // namespace
}  // namespace zero3

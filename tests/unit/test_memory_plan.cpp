// The memory plan: exact bytes for a crafted model under each stage and offload combination, and the
// Llama unit lists against the published parameter counts.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3 {
namespace {

// Units of 30, 7, 28 and 101 elements. On 4 ranks their slices are 8, 2, 7 and 26 elements (padded units
// 32, 8, 28, 104): 43 owned elements per rank, 172 padded in all.
ModelDesc crafted() {
  ModelDesc m;
  m.name = "crafted";
  m.units = {{"a", {{10, 3}}}, {"b", {{7}}}, {"c", {{5, 5}, {3}}}, {"d", {{101}}}};
  return m;
}

Config bf16_config(int stage) {
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 40;
  c.zero.prefetch_bucket_size = 40;
  c.zero.param_persistence_threshold = 10;  // unit b (7 elements) stays gathered
  return c;
}

int64_t bytes(const MemoryPlan& p, MemoryCategory cat, MemoryTier tier) {
  int64_t total = 0;
  for (const auto& e : p.entries) total += (e.category == cat && e.tier == tier) ? e.bytes : 0;
  return total;
}

MemoryPlanOptions four_ranks() {
  MemoryPlanOptions o;
  o.world_size = 4;
  o.ranks_per_node = 2;
  return o;
}

// Every stage has one open backward scope's fp32 buffer for the largest unit (d: 104 padded elements).
constexpr int64_t kScope = 104 * 4;
// Reducer buckets in bf16 (communication_data_type follows the compute dtype, as DeepSpeed's): all-reduce
// 4 x min(40, 166); reduce-scatter 4 x (C * 4 + C), C = min(40 / 4, 43). Four: the largest unit (d, 101 elements,
// 104 padded) spans three buckets of 40, and one more fills while they are reduced.
constexpr int64_t kAllReduce = 4 * 40 * 2;
constexpr int64_t kScatter = 4 * (10 * 4 + 10) * 2;

TEST(MemoryPlan, Padding) {
  MemoryPlan p = plan_memory(crafted(), bf16_config(0), four_ranks());
  EXPECT_EQ(p.total_params, 166);
  EXPECT_EQ(p.padded_params, 172);
  EXPECT_EQ(p.shard_params, 43);
  EXPECT_EQ(p.largest_unit, 104);
  EXPECT_EQ(p.nodes, 2);
}

TEST(MemoryPlan, Stage0) {
  MemoryPlan p = plan_memory(crafted(), bf16_config(0), four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), 172 * 2);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::device), 172 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::device), kScope + 172 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::device), 172 * 8);
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::device), kAllReduce);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 3512 + kAllReduce);
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 0);
  EXPECT_EQ(p.node_bytes(MemoryTier::device), 2 * (3512 + kAllReduce));
}

TEST(MemoryPlan, Stage1) {
  MemoryPlan p = plan_memory(crafted(), bf16_config(1), four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), 344);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::device), 43 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::device), kScope + 172 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::device), 43 * 8);
  EXPECT_EQ(p.rank_bytes(), 344 + 172 + 1104 + 344 + kAllReduce);
}

TEST(MemoryPlan, Stage2) {
  MemoryPlan p = plan_memory(crafted(), bf16_config(2), four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), 344);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::device), 172);
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::device), kScope + 43 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::device), 344);
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::device), kScatter);
  EXPECT_EQ(p.rank_bytes(), 1448 + kScatter);
}

TEST(MemoryPlan, Stage3) {
  MemoryPlan p = plan_memory(crafted(), bf16_config(3), four_ranks());
  EXPECT_EQ(p.persistent_numel, 7);
  EXPECT_EQ(p.persistent_params, 8);
  // Forward a (prefetches c: 28 <= 40), b (persistent), c, d; every closing unit is kept for its backward
  // use (stage3_max_reuse_distance is 1e9), so a, c and d are gathered together when d is entered.
  EXPECT_EQ(p.live_numel, 30 + 28 + 101);
  EXPECT_EQ(p.live_params, 32 + 28 + 104);
  // Slices of all units (43), the persistent unit b (8), the gathered worst case (164).
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), (43 + 8 + 164) * 2);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::device), 172);
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::device), kScope + 172);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::device), 344);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 430 + 172 + 588 + 344 + kScatter);
  EXPECT_EQ(p.rank_bytes(MemoryCategory::params), 430);
}

TEST(MemoryPlan, Stage3Schedule) {
  Config c = bf16_config(3);
  c.zero.max_reuse_distance = 0;
  // a + prefetched c are released on exit; d (distance 0 to its backward use) prefetches c again.
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.live_numel, 101 + 28);
  EXPECT_EQ(p.live_params, 104 + 28);
  c.zero.prefetch_bucket_size = 0;  // no prefetch, no reuse: one unit at a time
  EXPECT_EQ(plan_memory(crafted(), c, four_ranks()).live_numel, 101);

  c = bf16_config(3);
  c.zero.max_live_parameters = 120;  // entering d evicts the kept a and c; c is not prefetched beside d
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.live_numel, 101);
  EXPECT_EQ(p.live_params, 104);
  c.zero.max_live_parameters = 10;  // the entered unit is gathered whatever the cap
  EXPECT_EQ(plan_memory(crafted(), c, four_ranks()).live_params, 104);
  c.zero.max_live_parameters = 1'000'000;
  c.zero.prefetch_bucket_size = 1000;
  c.zero.model_persistence_threshold = 0;  // nothing may persist: b is gathered too
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.persistent_params, 0);
  EXPECT_EQ(p.live_numel, 166);
  EXPECT_EQ(p.live_params, 172);
}

// Offload from a GPU (zero3.device is not "cpu"): the optimizer step's pinned staging holds 2 tiles of gradients
// and, unless the parameter slices are on the host, 2 tiles of compute copies; a tile is the largest slice here
// (26 elements, sub_group_size being larger).
constexpr int64_t kTile = 26;

TEST(MemoryPlan, Stage3OffloadOptimizerCpu) {
  Config c = bf16_config(3);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::host), 172);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::host), 344);
  // The gradient accumulator stays on the device; the step copies it down tile by tile.
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::host), 0);
  EXPECT_EQ(bytes(p, MemoryCategory::grads, MemoryTier::device), kScope + 172);
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::host), 2 * kTile * (4 + 2));
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 172 + 344 + 2 * kTile * 6);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 430 + kScope + 172 + kScatter);
  EXPECT_EQ(p.node_bytes(MemoryTier::host), 2 * (516 + 2 * kTile * 6));
  // On the cpu device nothing is staged.
  c.zero3.device = "cpu";
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 172 + 344);
}

TEST(MemoryPlan, Stage3OffloadBothCpu) {
  Config c = bf16_config(3);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  c.zero.offload_param.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::host), 86);
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), 16 + 328);
  // Adam writes the host slices: only gradients are staged.
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::host), 2 * kTile * 4);
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 86 + 172 + 344 + 2 * kTile * 4);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 344 + kScope + 172 + kScatter);
}

TEST(MemoryPlan, Stage3OffloadParamOnly) {
  Config c = bf16_config(3);
  c.zero.offload_param.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 86);
  // The device optimizer's step writes a tile of parameters on the device before it goes to the host slice.
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::device), kScatter + kTile * 2);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::device), 172);
}

TEST(MemoryPlan, Stage3OffloadBothNvme) {
  Config c = bf16_config(3);
  c.zero.offload_optimizer.device = OffloadDevice::nvme;
  c.zero.offload_param.device = OffloadDevice::nvme;
  c.zero.offload_param.buffer_count = 5;
  c.zero.offload_param.buffer_size = 10;
  c.zero.offload_optimizer.buffer_count = 4;
  MemoryPlanOptions o = four_ranks();
  o.activation_bytes = 1000;
  MemoryPlan p = plan_memory(crafted(), c, o);
  EXPECT_EQ(p.rank_bytes(MemoryTier::nvme), 86 + 172 + 344);
  // Host: 5 x 10 bf16 parameter staging buffers, 4 x 43 fp32 optimizer buffers (sub_group_size is larger than
  // the owned elements), the step's 2 gradient tiles.
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::host), 100 + 688 + 2 * kTile * 4);
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 100 + 688 + 2 * kTile * 4);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 16 + 328 + kScope + 172 + kScatter + 1000);
  c.zero.sub_group_size = 10;
  EXPECT_EQ(bytes(plan_memory(crafted(), c, o), MemoryCategory::buffers, MemoryTier::host),
            100 + 4 * 10 * 4 + 2 * 10 * 4);
}

TEST(MemoryPlan, Stage1And2OffloadOptimizer) {
  Config c = bf16_config(2);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 172 + 344 + 2 * kTile * 6);  // master, m and v, staging
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 344 + kScope + 172 + kScatter);
  c.zero.stage = 1;
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 172 + 344 + 2 * kTile * 6);
  EXPECT_EQ(p.rank_bytes(MemoryTier::device), 344 + kScope + 688 + kAllReduce);
}

TEST(MemoryPlan, Fp32OffloadOnAGpuKeepsTheMasterApart) {
  Config c = bf16_config(2);
  c.bf16.enabled = false;
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::device), 172 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::host), 43 * 4);
  c.zero.stage = 3;
  c.zero.offload_param.device = OffloadDevice::cpu;
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(bytes(p, MemoryCategory::params, MemoryTier::host), 43 * 4);
  EXPECT_EQ(bytes(p, MemoryCategory::master, MemoryTier::host), 43 * 4);
  // On the cpu device the slice is the master.
  c.zero3.device = "cpu";
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryCategory::master), 0);
}

TEST(MemoryPlan, Fp32HasNoSeparateMaster) {
  Config c = bf16_config(3);
  c.bf16.enabled = false;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryCategory::master), 0);
  EXPECT_EQ(p.rank_bytes(MemoryCategory::params), (43 + 8 + 164) * 4);
  EXPECT_EQ(p.rank_bytes(MemoryCategory::grads), kScope + 172);
  c.zero.stage = 1;
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryCategory::master), 0);
  EXPECT_EQ(p.rank_bytes(MemoryCategory::params), 172 * 4);
}

TEST(MemoryPlan, SixteenBitAccumulation) {
  Config c = bf16_config(3);
  c.grad_accum_dtype = DType::bf16;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.rank_bytes(MemoryCategory::grads), 104 * 2 + 43 * 2);
  // bf16 buckets, and the fp32 step tile of the largest slice (26 elements).
  EXPECT_EQ(p.rank_bytes(MemoryCategory::buffers), 4 * (40 + 10) * 2 + 26 * 4);
  c.communication_data_type = DType::f32;
  EXPECT_EQ(plan_memory(crafted(), c, four_ranks()).rank_bytes(MemoryCategory::buffers), 4 * (40 + 10) * 4 + 26 * 4);
}

// hpZ holds a secondary partition of every non-persistent unit (a, c, d: padded 32, 28, 104) over its group of 2;
// MiCS cuts the slices for its shard group of 2 (15, 4, 14, 51 elements) and adds the buckets of the all-reduce
// across the replicas.
TEST(MemoryPlan, Layouts) {
  Config c = bf16_config(3);
  c.zero.hpz_partition_size = 2;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.layout, "hpZ: primary partition over 4 ranks, secondary within groups of 2 ranks (one node)");
  EXPECT_EQ(p.partition_size, 4);
  EXPECT_EQ(p.shard_params, 43);
  int64_t secondary = 0;
  for (const auto& e : p.entries) secondary += e.what.find("hpZ secondary") != std::string::npos ? e.bytes : 0;
  EXPECT_EQ(secondary, (32 + 28 + 104) / 2 * 2);
  EXPECT_NE(format_memory_plan(p).find("hpZ secondary partition, 1/2 of each unit (bf16)"), std::string::npos);

  c.zero.hpz_partition_size = 1;
  c.zero.mics_shard_size = 2;
  p = plan_memory(crafted(), c, four_ranks());
  EXPECT_EQ(p.partition_size, 2);
  EXPECT_EQ(p.shard_params, 15 + 4 + 14 + 51);
  EXPECT_EQ(p.padded_params, 2 * 84);
  // Reduce-scatter over 2: C = min(40 / 2, 84) = 20, 4 buckets (d: 102 padded elements over buckets of 40); across
  // the 2 replicas: min(40, 84) = 40, 3 buckets (d: a slice of 51).
  EXPECT_EQ(bytes(p, MemoryCategory::buffers, MemoryTier::device), 4 * (20 * 2 + 20) * 2 + 3 * 40 * 2);
  EXPECT_NE(format_memory_plan(p).find("layout: MiCS: shard groups of 2 ranks (one node: HSDP) x 2 replicas"),
            std::string::npos);

  c.zero.mics_shard_size = 3;
  EXPECT_THROW(plan_memory(crafted(), c, four_ranks()), ConfigError);
}

TEST(MemoryPlan, RefusesWhatCannotRun) {
  Config c = bf16_config(2);
  c.zero.offload_param.device = OffloadDevice::cpu;
  EXPECT_THROW(plan_memory(crafted(), c, four_ranks()), ConfigError);
  c = bf16_config(0);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  EXPECT_THROW(plan_memory(crafted(), c, four_ranks()), ConfigError);
  c = bf16_config(3);
  c.zero.prefetch_bucket_size.reset();  // "auto" left unresolved
  EXPECT_THROW(plan_memory(crafted(), c, four_ranks()), ConfigError);
  c = bf16_config(1);
  c.zero.reduce_bucket_size.reset();
  EXPECT_THROW(plan_memory(crafted(), c, four_ranks()), ConfigError);
  MemoryPlanOptions o;
  o.world_size = 0;
  EXPECT_THROW(plan_memory(crafted(), bf16_config(3), o), InvalidArgument);
  EXPECT_THROW(plan_memory(ModelDesc{}, bf16_config(3), four_ranks()), InvalidArgument);
}

TEST(MemoryPlan, TableNamesEveryEntry) {
  Config c = bf16_config(3);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  MemoryPlan p = plan_memory(crafted(), c, four_ranks());
  std::string table = format_memory_plan(p);
  EXPECT_NE(table.find("ZeRO stage 3, bf16, world size 4 (2 nodes x 2 ranks)"), std::string::npos) << table;
  for (const auto& e : p.entries) EXPECT_NE(table.find(e.what), std::string::npos) << e.what;
  EXPECT_NE(table.find("1,656"), std::string::npos) << table;  // host bytes per node
}

std::string source_dir() {
  const char* d = std::getenv("ZERO3_SOURCE_DIR");
  return d ? d : ".";
}

TEST(MemoryPlan, Llama3_8B) {
  int64_t hidden = 0;
  ModelDesc m = load_model_desc(source_dir() + "/configs/models/llama-3-8b.json", &hidden);
  EXPECT_EQ(hidden, 4096);
  EXPECT_EQ(m.numel(), 8'030'261'248);
  ASSERT_EQ(m.units.size(), 34u);
  EXPECT_EQ(m.units[0].numel(), 128256LL * 4096);
  EXPECT_EQ(m.units[1].numel(), 218'112'000);
  EXPECT_EQ(m.units[33].numel(), 128256LL * 4096 + 4096);

  // The seed's setting: stage 3, bf16, CPU offload of both, 16 ranks on 4 nodes.
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.zero.reduce_bucket_size = 16'777'216;    // 4096^2
  c.zero.prefetch_bucket_size = 15'099'494;  // 0.9 * 4096^2
  c.zero.param_persistence_threshold = 40'960;
  c.zero.offload_param.device = OffloadDevice::cpu;
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  MemoryPlanOptions o;
  o.world_size = 16;
  o.ranks_per_node = 4;
  MemoryPlan p = plan_memory(m, c, o);
  EXPECT_EQ(p.shard_params, 501'891'328);  // every unit divides by 16
  // One checkpoint: fp32 master, exp_avg and exp_avg_sq of every parameter, plus the header allowance.
  EXPECT_EQ(p.checkpoint_bytes, 12LL * 8'030'261'248 + 34 * 16 * 4096 + 65536);
  EXPECT_EQ(checkpoint_bytes(m, 16), p.checkpoint_bytes);
  EXPECT_EQ(p.persistent_params, 0);
  // No unit fits the prefetch bucket, but the first unit ahead is fetched whatever its size (Schedule's rule), and
  // the layers are too far from their backward use to be kept (the head in between is 1.05e9 elements), so the
  // worst moment is the head (final norm + lm_head) with the last layer gathered ahead for its backward.
  const int64_t head = 128256LL * 4096 + 4096, layer = 218'112'000;
  EXPECT_EQ(p.live_numel, head + layer);
  EXPECT_EQ(bytes(p, MemoryCategory::optimizer_state, MemoryTier::host), 8LL * 501'891'328);
  // Host per rank: bf16 slices 2, fp32 master 4, m and v 8 bytes per owned parameter, and the step's two
  // pinned fp32 gradient tiles of the largest slice (the head's, 32,833,792 elements).
  const int64_t staging = 2 * 32'833'792LL * 4;
  EXPECT_EQ(p.rank_bytes(MemoryTier::host), 14LL * 501'891'328 + staging);
  EXPECT_EQ(p.node_bytes(MemoryTier::host), 4 * (14LL * 501'891'328 + staging));
  // Device per rank: the fp32 gradient slices, one backward scope's fp32 buffer (of the largest unit), the
  // gathered head and layer and the bf16 reduce-scatter buckets, 33 of them on a GPU (the head's 525,340,672
  // padded elements in buckets of 16,777,216, plus the one filling): under 6.5 GiB, leaving a 48 GB GPU to
  // activations.
  EXPECT_EQ(p.rank_bytes(MemoryTier::device),
            4LL * 501'891'328 + 4 * head + 2 * (head + layer) + 33 * (16'777'216 + 16'777'216 / 16) * 2);
  EXPECT_LT(p.rank_bytes(MemoryTier::device), int64_t{13} << 29);
}

TEST(MemoryPlan, LlamaTinyAndTied) {
  ModelDesc m = load_model_desc(source_dir() + "/configs/models/llama-3-tiny.json");
  // embed 256x64; per layer q 64x64, k and v 32x64, o 64x64, gate and up 176x64, down 64x176, 2 norms of 64.
  EXPECT_EQ(m.numel(), 16384 + 2 * 46208 + 64 + 16384);
  LlamaDims d{.hidden_size = 64,
              .intermediate_size = 176,
              .num_hidden_layers = 2,
              .num_attention_heads = 4,
              .num_key_value_heads = 2,
              .head_dim = 0,
              .vocab_size = 256,
              .tie_word_embeddings = true};
  ModelDesc tied = llama_model_desc(d);
  EXPECT_EQ(tied.numel(), 16384 + 2 * 46208 + 64);
  EXPECT_EQ(tied.units.back().params.size(), 1u);
  d.num_key_value_heads = 3;
  EXPECT_THROW(llama_model_desc(d), InvalidArgument);
}

TEST(MemoryPlan, ParseUnitList) {
  int64_t hidden = -1;
  ModelDesc m = parse_model_desc(R"({"name": "mlp", "hidden_size": 8,
      "units": [{"name": "in", "params": [[8, 4], [8]]}, {"params": [[3]]}]})",
                                 "mlp.json", &hidden);
  EXPECT_EQ(m.name, "mlp");
  EXPECT_EQ(hidden, 8);
  ASSERT_EQ(m.units.size(), 2u);
  EXPECT_EQ(m.units[0].numel(), 40);
  EXPECT_EQ(m.units[1].name, "unit.1");
  try {
    parse_model_desc(R"({"units": [{"name": "x", "params": [[4, 0]]}]})", "bad.json");
    FAIL() << "a zero dimension was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: units[0].params[0]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_desc(R"({"units": [{"name": "x", "parms": [[4]]}]})", "typo.json"), ConfigError);
  EXPECT_THROW(parse_model_desc(R"({"hidden_size": 64})", "llama.json"), ConfigError);  // no intermediate_size
  EXPECT_THROW(parse_model_desc("{", "broken.json"), ConfigError);
  EXPECT_THROW(load_model_desc("/nonexistent/model.json"), ConfigError);
}

// `zero3 plan` end to end: the seed's DeepSpeed config ("auto" buckets and batch sizes) and the published
// Llama-3-8B config, 16 ranks on 4 nodes.
TEST(MemoryPlan, PlanCommand) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (!bin) GTEST_SKIP() << "ZERO3_BIN_DIR is not set (run through ctest)";
  std::string src = source_dir();
  std::string cmd = std::string(bin) + "/zero3 plan --model " + src + "/configs/models/llama-3-8b.json --config " +
                    src + "/configs/llama-3-8b-stage3.json --world-size 16 --ranks-per-node 4 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int status = pclose(f);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("ZeRO stage 3, bf16, world size 16 (4 nodes x 4 ranks)"), std::string::npos) << out;
  EXPECT_NE(out.find("8,030,261,248"), std::string::npos) << out;
  // Host per rank: 14 bytes for each of the 501,891,328 owned parameters and the step's two pinned fp32
  // gradient tiles of 32,833,792 elements; per node, 4 ranks.
  EXPECT_NE(out.find("7,289,148,928"), std::string::npos) << out;
  EXPECT_NE(out.find("29,156,595,712"), std::string::npos) << out;
  // reduce_bucket_size "auto" = 4096^2: 33 buckets (as many as hold the head's reduction, plus one) of 16,777,216
  // in + 1,048,576 out bf16 elements (DeepSpeed's communication dtype under bf16).
  EXPECT_NE(out.find("1,176,502,272"), std::string::npos) << out;
  // And the traffic per optimizer step of each node.
  EXPECT_NE(out.find("zero3 traffic plan: ZeRO-3 over 16 ranks"), std::string::npos) << out;
  std::string bad = std::string(bin) + "/zero3 plan --model " + src + "/configs/models/llama-3-8b.json 2>/dev/null";
  FILE* g = popen(bad.c_str(), "r");
  ASSERT_NE(g, nullptr);
  while (fread(buf, 1, sizeof buf, g)) {
  }
  int bad_status = pclose(g);
  EXPECT_TRUE(WIFEXITED(bad_status) && WEXITSTATUS(bad_status) == 2);  // usage error: no --config
}

}  // namespace
}  // namespace zero3

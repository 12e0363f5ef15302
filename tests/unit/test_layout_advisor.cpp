// The layout advisor (zero3/layout_advisor.hpp, `zero3 plan --advise`): the seed's job on the seed's cluster (its
// config verbatim, Llama-3-8B, 4 x g6e.12xlarge over EFA), where every ranked row fits, the layouts the engine
// refuses are never ranked, and every row's edits make a config that `zero3 config check` accepts and whose plan is
// the row's; a GPU or host too small for a layout keeps it out of the ranking; the engine's checks as the advisor
// calls them; the edits on configs with aliases and nvme paths; and bad files named with their key.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/run_command.hpp"
#include "zero3/activation_plan.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/error.hpp"
#include "zero3/layout_advisor.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/step_time_model.hpp"

namespace zero3 {
using testing::run_command;

namespace {

std::string source_dir() {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  return src != nullptr ? src : "";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The seed's activations per GPU without checkpointing, micro-batch 4 x seq 512, bf16 on a GPU, as
// `llama3_train --dry-run --device cuda --no-grad-checkpointing` estimates them (docs/performance-model.md).
constexpr int64_t kSeedActivationBytes = 7320166404;

struct SeedJob {
  std::string config_path, config_text;
  ModelDesc model;
  LlamaDims dims;
  ClusterDesc cluster;
  AdviseOptions options;
};

SeedJob seed_job(const std::string& cluster_file = "g6e-12xlarge-efa.json") {
  SeedJob j;
  const std::string src = source_dir();
  j.config_path = src + "/configs/llama-3-8b-stage3.json";
  j.config_text = read_text(j.config_path);
  int64_t hidden = 0;
  j.model = load_model_desc(src + "/configs/models/llama-3-8b.json", &hidden, &j.dims);
  j.cluster = load_cluster_desc(src + "/configs/clusters/" + cluster_file);
  j.options.seq_len = 512;
  j.options.checkpointing = false;  // the seed's run; the activations are estimated, not given
  j.options.inputs.micro_batch = 4;
  j.options.inputs.grad_accum = 4;
  j.options.inputs.hidden_size = hidden;
  j.options.pipelines = false;  // the unpipelined answer; test_layout_advisor_pipeline.cpp ranks the pipelines too
  return j;
}

Advice advise(const SeedJob& j) {
  return advise_layouts(j.config_text, j.config_path, j.model, j.dims, j.cluster, j.options);
}

// The config a row's edits make, read and resolved as `zero3 config check --world-size 16` does.
Config edited_config(const SeedJob& j, const AdvisedLayout& a) {
  Config c = parse_config(apply_config_edits(j.config_text, a.edits, j.config_path), "edited");
  ResolveInputs in = j.options.inputs;
  in.world_size = j.cluster.world();
  resolve(c, in);
  return c;
}

// A ranked row's edits as format_advice() prints them: one line per row, distinct for every layout.
std::string edits_line(const AdvisedLayout& a) {
  std::string line;
  for (const ConfigEdit& e : a.edits) line += (line.empty() ? "" : ", ") + e.text();
  return "edits: " + (line.empty() ? std::string("none (your config as it is)") : line) + "\n";
}

// Every ranked row fits the GPU and the node's host memory, is in order, and is what its edits make: the config
// they produce plans to the row's bytes and times (plan_memory, model_step_time) and the engine takes it. Refused
// rows are the engine's refusals, and never ranked.
TEST(LayoutAdvisor, TheSeedsRankingFitsAndIsWhatItsEditsMake) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  // plain, hpZ (secondary partition on the GPU or in host memory), MiCS over 1 and 2 nodes, hierarchical over 2 and
  // 4: 7 shapes x 4 quantizations x 4 offloads.
  ASSERT_EQ(a.ranked.size() + a.not_fitting.size() + a.refused.size(), 112u);
  ASSERT_FALSE(a.ranked.empty());
  EXPECT_TRUE(a.activations_estimated);
  EXPECT_EQ(a.activation_bytes, kSeedActivationBytes);
  EXPECT_EQ(a.gpu_headroom_bytes, kDefaultGpuHeadroomBytes);
  EXPECT_EQ(a.gpu_plan_bytes, static_cast<int64_t>((44.99 - 2) * (1 << 30)));
  EXPECT_EQ(a.host_plan_bytes, int64_t{352} << 30);

  MemoryPlanOptions memory;
  memory.world_size = 16;
  memory.ranks_per_node = 4;
  memory.activation_bytes = kSeedActivationBytes;
  StepTimeOptions timing;
  timing.seq_len = 512;
  for (size_t i = 0; i < a.ranked.size(); ++i) {
    const AdvisedLayout& r = a.ranked[i];
    SCOPED_TRACE(r.choice.describe(4));
    EXPECT_EQ(r.verdict, Verdict::ranked);
    EXPECT_LE(r.gpu_bytes + a.gpu_headroom_bytes, a.gpu_plan_bytes);
    EXPECT_EQ(r.gpu_free_bytes, a.gpu_plan_bytes - r.gpu_bytes);
    EXPECT_LE(r.host_node_bytes, a.host_plan_bytes);
    if (i > 0) {
      EXPECT_GE(r.time.step_high_s(), a.ranked[i - 1].time.step_high_s());
    }
    EXPECT_LE(r.time.step_low_s(), r.time.step_high_s());
    const Config c = edited_config(j, r);
    EXPECT_EQ(engine_refusal(c, j.cluster), "");
    EXPECT_EQ(c.zero.mics_shard_size > 0 ? c.zero.mics_shard_size : -1, r.choice.mics_shard_size);
    EXPECT_EQ(std::max<int64_t>(c.zero.hpz_partition_size, 1), r.choice.hpz_partition_size);
    EXPECT_EQ(c.zero.quantized_weights, r.choice.qwz);
    EXPECT_EQ(c.zero.quantized_gradients, r.choice.qgz);
    EXPECT_EQ(c.zero.offload_param.device, r.choice.offload_param);
    EXPECT_EQ(c.zero.offload_optimizer.device, r.choice.offload_optimizer);
    EXPECT_EQ(c.zero3.hpz_secondary_on_host, r.choice.secondary_on_host);
    const MemoryPlan plan = plan_memory(j.model, c, memory);
    EXPECT_EQ(plan.rank_bytes(MemoryTier::device), r.gpu_bytes);
    EXPECT_EQ(plan.node_bytes(MemoryTier::host), r.host_node_bytes);
    const StepTime t = model_step_time(j.model, j.dims, c, j.cluster, timing);
    EXPECT_DOUBLE_EQ(t.step_s, r.time.step_s);
    EXPECT_DOUBLE_EQ(t.step_fixed_s, r.time.step_fixed_s);
  }
  for (const AdvisedLayout& r : a.not_fitting) {
    SCOPED_TRACE(r.choice.describe(4));
    EXPECT_TRUE(r.gpu_bytes + a.gpu_headroom_bytes > a.gpu_plan_bytes || r.host_node_bytes > a.host_plan_bytes);
  }
  // The engine takes every layout enumerated here, hpZ with parameter offload included.
  EXPECT_EQ(a.refused.size(), 0u);
  bool hpz_with_param_offload = false, secondary_on_host = false;
  for (const AdvisedLayout& r : a.ranked) {
    hpz_with_param_offload |= r.choice.hpz_partition_size > 1 && r.choice.offload_param != OffloadDevice::none;
    secondary_on_host |= r.choice.secondary_on_host;
  }
  EXPECT_TRUE(hpz_with_param_offload);
  EXPECT_TRUE(secondary_on_host);
}

// The seed's answer (docs/performance-model.md, "The advised layout"), with its activations estimated (6.82 GiB
// per GPU without checkpointing), the default 1 GiB headroom, and both readings. The nine fastest layouts are all
// MiCS/HSDP over one node: its gathers and reduce-scatters stay on the node's PCIe, and only the once-a-step
// all-reduce across the 4 replicas crosses the links, so both readings keep its step near 11 s or below. hpZ + qwZ +
// qgZ without offload leads by the bandwidth reading (5.38 s) but its per-bucket reductions cross nodes every
// micro-step, which the fixed-cost reading prices at 29 s: the fixed-cost reading decides, and hpZ would lead only
// below about 4.9 ms per collective across nodes (the description's fit: 13.99 ms). MiCS/HSDP shards the states
// over 4 GPUs instead of 16: the layout that keeps the optimizer on the GPU and offloads only the parameters (42.76
// GiB) leaves 0.23 GiB, under the headroom, so it does not fit; the first row keeps the seed's two offloads and adds
// qwZ and qgZ (three keys), a layout DeepSpeed refuses (MiCS with optimizer offload) and quantizes nothing of
// (qwZ, qgZ under MiCS). The first row DeepSpeed runs as written is rank 3, MiCS/HSDP with only the parameters
// offloaded (1.10 GiB free). The seed's own config (plain ZeRO-3, both offloads) ranks near the bottom, more than 4
// times slower than the first row.
TEST(LayoutAdvisor, TheSeedsAnswer) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  EXPECT_TRUE(a.activations_estimated);
  EXPECT_EQ(a.activation_bytes, kSeedActivationBytes);
  EXPECT_EQ(a.gpu_headroom_bytes, int64_t{1} << 30);
  ASSERT_GE(a.ranked.size(), 10u);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(a.ranked[i].choice.mics_shard_size, 4) << i;
    EXPECT_FALSE(a.ranked[i].choice.hierarchical) << i;
  }
  const AdvisedLayout& first = a.ranked[0];
  EXPECT_TRUE(first.choice.qwz && first.choice.qgz);
  EXPECT_EQ(first.choice.offload_optimizer, OffloadDevice::cpu);
  EXPECT_EQ(first.choice.offload_param, OffloadDevice::cpu);
  EXPECT_EQ(first.edits, (std::vector<ConfigEdit>{{"zero_optimization.mics_shard_size", "4"},
                                                  {"zero_optimization.zero_quantized_weights", "true"},
                                                  {"zero_optimization.zero_quantized_gradients", "true"}}));
  EXPECT_NEAR(first.time.step_low_s(), 9.01, 0.005);
  EXPECT_NEAR(first.time.step_high_s(), 11.50, 0.005);
  ASSERT_EQ(first.deepspeed.size(), 3u);
  EXPECT_TRUE(first.deepspeed[0].refuses);
  // The first row DeepSpeed runs as written: MiCS/HSDP, optimizer on the GPU, parameters offloaded.
  size_t first_deepspeed_runs = a.ranked.size();
  for (size_t i = 0; i < a.ranked.size() && first_deepspeed_runs == a.ranked.size(); ++i) {
    if (a.ranked[i].deepspeed.empty()) first_deepspeed_runs = i;
  }
  ASSERT_EQ(first_deepspeed_runs, 2u);
  const AdvisedLayout& third = a.ranked[2];
  EXPECT_FALSE(third.choice.qwz || third.choice.qgz);
  EXPECT_EQ(third.choice.offload_optimizer, OffloadDevice::none);
  EXPECT_EQ(third.choice.offload_param, OffloadDevice::cpu);
  EXPECT_NEAR(static_cast<double>(third.gpu_free_bytes) / (1 << 30), 1.10, 0.005);

  // Both readings: hpZ + qwZ + qgZ without offload leads by bandwidth alone, the first row by the fixed cost alone.
  ASSERT_TRUE(a.readings.has_value());
  EXPECT_EQ(a.readings->fixed_cost_first, 0u);
  const AdvisedLayout& fastest_by_bandwidth = a.ranked[a.readings->bandwidth_first];
  EXPECT_EQ(a.readings->bandwidth_first, 9u);
  EXPECT_EQ(fastest_by_bandwidth.choice.hpz_partition_size, 4);
  EXPECT_TRUE(fastest_by_bandwidth.choice.qwz && fastest_by_bandwidth.choice.qgz);
  EXPECT_EQ(fastest_by_bandwidth.choice.offload_optimizer, OffloadDevice::none);
  EXPECT_EQ(fastest_by_bandwidth.choice.offload_param, OffloadDevice::none);
  EXPECT_NEAR(fastest_by_bandwidth.time.step_s, 5.38, 0.005);
  EXPECT_NEAR(fastest_by_bandwidth.time.step_fixed_s, 29.26, 0.005);
  EXPECT_EQ(first.rank_fixed_cost, 1u);
  EXPECT_EQ(first.rank_bandwidth, 17u);
  ASSERT_TRUE(a.readings->crossover_overhead_ms.has_value());
  EXPECT_NEAR(*a.readings->crossover_overhead_ms, 4.88, 0.011);

  // MiCS/HSDP over one node without any offload does not fit, nor with the parameters offloaded and qwZ (under the
  // headroom).
  bool mics_plain_too_big = false, mics_qwz_param_under_headroom = false;
  for (const AdvisedLayout& r : a.not_fitting) {
    if (r.choice.mics_shard_size != 4) continue;
    if (!r.choice.qwz && !r.choice.qgz && r.choice.offload_optimizer == OffloadDevice::none &&
        r.choice.offload_param == OffloadDevice::none) {
      mics_plain_too_big = true;
      EXPECT_GT(r.gpu_bytes, a.gpu_plan_bytes);
    }
    if (r.choice.qwz && !r.choice.qgz && r.choice.offload_optimizer == OffloadDevice::none &&
        r.choice.offload_param == OffloadDevice::cpu) {
      mics_qwz_param_under_headroom = true;
      EXPECT_LT(r.gpu_bytes, a.gpu_plan_bytes);
    }
  }
  EXPECT_TRUE(mics_plain_too_big);
  EXPECT_TRUE(mics_qwz_param_under_headroom);
  ASSERT_TRUE(a.user_config_rank.has_value());
  const AdvisedLayout& user = a.ranked[*a.user_config_rank];
  EXPECT_TRUE(user.edits.empty());
  EXPECT_GT(*a.user_config_rank, a.ranked.size() * 3 / 4);
  EXPECT_GT(user.time.step_low_s(), 4 * a.ranked[0].time.step_high_s());
}

// The activations every plan counts are the figure `llama3_train --dry-run` printed for the seed's job (recorded in
// docs/performance-model.md before the estimate moved into the library), by part; checkpointing keeps one layer's
// cache instead of 32 and nothing else.
TEST(LayoutAdvisor, TheSeedsActivationsAreTheDryRunsFigure) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  ActivationOptions o;
  o.micro_batch = 4;
  o.seq_len = 512;
  o.checkpointing = false;
  const ActivationEstimate off = estimate_activations(j.dims, o);
  EXPECT_EQ(off.total(), kSeedActivationBytes);
  o.checkpointing = true;
  const ActivationEstimate on = estimate_activations(j.dims, o);
  EXPECT_EQ(off.layer_caches, 32 * on.layer_caches);
  EXPECT_EQ(off.total() - on.total(), off.layer_caches - on.layer_caches);
  EXPECT_EQ(on.layer_inputs, 33 * 2048 * 4096 * 2);  // (L + 1) residual streams of 2048 tokens in bf16

  // The caller's figure replaces the estimate.
  SeedJob given = seed_job();
  given.options.activation_bytes = 123 << 20;
  const Advice a = advise(given);
  EXPECT_FALSE(a.activations_estimated);
  EXPECT_EQ(a.activation_bytes, 123 << 20);
  // The advisor's default is llama3_train's: checkpointing on.
  SeedJob defaults = seed_job();
  defaults.options.checkpointing = AdviseOptions{}.checkpointing;
  EXPECT_EQ(advise(defaults).activation_bytes, on.total());

  // Bad input, each named.
  LlamaDims bad = j.dims;
  bad.num_attention_heads = 0;
  EXPECT_THROW(estimate_activations(bad, o), InvalidArgument);
  o.micro_batch = 0;
  try {
    estimate_activations(j.dims, o);
    ADD_FAILURE() << "a micro-batch of 0 was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("micro_batch 0"), std::string::npos) << e.what();
  }
}

// Without --activation-bytes the seed's job never ranks a layout whose activations do not fit: MiCS/HSDP + qwZ + qgZ
// without offload, 40.85 GiB of states and buffers, is 47.67 GiB with its 6.82 GiB of activations, over the L40S's
// 42.99 GiB. A layout fits only with the headroom left free: the one that leaves 0.23 GiB ranks at no headroom and
// not at the default 1 GiB.
TEST(LayoutAdvisor, ALayoutWhoseActivationsDoNotFitIsNeverRanked) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  SeedJob j = seed_job();
  const Advice a = advise(j);
  auto find = [](const std::vector<AdvisedLayout>& rows, const LayoutChoice& want) -> const AdvisedLayout* {
    for (const AdvisedLayout& r : rows) {
      if (r.choice == want) return &r;
    }
    return nullptr;
  };
  LayoutChoice hsdp_quantized;
  hsdp_quantized.mics_shard_size = 4;
  hsdp_quantized.qwz = hsdp_quantized.qgz = true;
  const AdvisedLayout* over = find(a.not_fitting, hsdp_quantized);
  ASSERT_NE(over, nullptr);
  EXPECT_EQ(find(a.ranked, hsdp_quantized), nullptr);
  EXPECT_NEAR(static_cast<double>(over->gpu_bytes) / (1 << 30), 47.67, 0.005);
  EXPECT_NEAR(static_cast<double>(over->gpu_bytes - a.activation_bytes) / (1 << 30), 40.85, 0.005);
  EXPECT_NE(over->reason.find("GPU 47.67 GiB + headroom 1.00 GiB > 42.99 GiB"), std::string::npos) << over->reason;

  LayoutChoice tight;  // MiCS/HSDP + qwZ, parameters offloaded: 42.76 GiB
  tight.mics_shard_size = 4;
  tight.qwz = true;
  tight.offload_param = OffloadDevice::cpu;
  const AdvisedLayout* at_default = find(a.not_fitting, tight);
  ASSERT_NE(at_default, nullptr);
  EXPECT_NEAR(static_cast<double>(at_default->gpu_free_bytes) / (1 << 30), 0.23, 0.005);
  j.options.gpu_headroom_bytes = 0;
  const Advice no_headroom = advise(j);
  EXPECT_NE(find(no_headroom.ranked, tight), nullptr);
  EXPECT_GT(no_headroom.ranked.size(), a.ranked.size());
  j.options.gpu_headroom_bytes = -1;
  EXPECT_THROW(advise(j), InvalidArgument);
}

// Each row's rank under each reading alone; the readings put different layouts first, and the output says which
// decides, why the ranking takes the slower one, and the cost per collective at which the first row changes.
TEST(LayoutAdvisor, BothReadingsAreVisible) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  std::vector<size_t> bandwidth, fixed;
  for (const AdvisedLayout& r : a.ranked) {
    bandwidth.push_back(r.rank_bandwidth);
    fixed.push_back(r.rank_fixed_cost);
  }
  std::sort(bandwidth.begin(), bandwidth.end());
  std::sort(fixed.begin(), fixed.end());
  for (size_t i = 0; i < a.ranked.size(); ++i) {
    EXPECT_EQ(bandwidth[i], i + 1);
    EXPECT_EQ(fixed[i], i + 1);
  }
  for (const AdvisedLayout& r : a.ranked) {
    for (const AdvisedLayout& o : a.ranked) {
      if (r.time.step_s < o.time.step_s) {
        EXPECT_LT(r.rank_bandwidth, o.rank_bandwidth);
      }
      if (r.time.step_fixed_s < o.time.step_fixed_s) {
        EXPECT_LT(r.rank_fixed_cost, o.rank_fixed_cost);
      }
    }
  }
  ASSERT_TRUE(a.readings.has_value());
  const AdvisedLayout& bw = a.ranked[a.readings->bandwidth_first];
  EXPECT_EQ(bw.rank_bandwidth, 1u);
  EXPECT_EQ(a.ranked[a.readings->fixed_cost_first].rank_fixed_cost, 1u);
  EXPECT_EQ(bw.choice.hpz_partition_size, 4);  // hpZ + qwZ + qgZ, as by the bandwidth reading at every efficiency
  EXPECT_TRUE(bw.choice.qwz && bw.choice.qgz);
  EXPECT_EQ(a.ranked[0].choice.mics_shard_size, 4);
  // Re-timed around the crossover: hpZ + qwZ + qgZ leads just below it, and another layout just above.
  ASSERT_TRUE(a.readings->crossover_overhead_ms.has_value());
  const double crossover = *a.readings->crossover_overhead_ms;
  EXPECT_GT(crossover, 0);
  EXPECT_LT(crossover, j.cluster.collective_overhead_ms);
  StepTimeOptions timing;
  timing.seq_len = 512;
  auto step_high = [&](const AdvisedLayout& r, double overhead) {
    ClusterDesc c = j.cluster;
    c.collective_overhead_ms = overhead;
    return model_step_time(j.model, j.dims, r.config, c, timing).step_high_s();
  };
  double best_below = step_high(a.ranked[0], crossover - 0.05), best_above = step_high(a.ranked[0], crossover + 0.05);
  for (const AdvisedLayout& r : a.ranked) {
    if (&r == &bw) continue;
    best_below = std::min(best_below, step_high(r, crossover - 0.05));
    best_above = std::min(best_above, step_high(r, crossover + 0.05));
  }
  EXPECT_LE(step_high(bw, crossover - 0.05), best_below);  // hpZ/host takes the same time
  EXPECT_GT(step_high(bw, crossover + 0.05), best_above);

  const std::string table = format_advice(a, j.cluster, 50);
  EXPECT_NE(table.find("the readings disagree on the first row: by bandwidth alone rank " +
                       std::to_string(a.readings->bandwidth_first + 1) + " (hpZ, one node + qwZ + qgZ"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("the fixed-cost reading decides rank 1"), std::string::npos) << table;
  EXPECT_NE(table.find("would lead only while a collective across nodes costs less than"), std::string::npos) << table;

  // One reading only (no collective_overhead_ms): the ranks agree and nothing is said.
  SeedJob one = seed_job();
  one.cluster.collective_overhead_ms = 0;
  const Advice single = advise(one);
  EXPECT_FALSE(single.readings.has_value());
  for (const AdvisedLayout& r : single.ranked) EXPECT_EQ(r.rank_bandwidth, r.rank_fixed_cost);
}

// What DeepSpeed refuses or changes, row by row, with where in DeepSpeed; zero3 ranks these layouts all the same.
TEST(LayoutAdvisor, DeepSpeedsLimitsAreNamed) {
  LayoutChoice mics;
  mics.mics_shard_size = 4;
  EXPECT_TRUE(deepspeed_differences(mics, 16).empty());
  mics.offload_optimizer = OffloadDevice::nvme;
  std::vector<DeepSpeedDifference> d = deepspeed_differences(mics, 16);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].refuses);
  EXPECT_NE(d[0].what.find("Local sharding has no support for CPU offloading"), std::string::npos);
  EXPECT_NE(d[0].where.find("runtime/zero/mics.py"), std::string::npos);
  mics.mics_shard_size = 16;  // one shard group: no replicas, nothing to all-reduce across them
  mics.hierarchical = true;
  EXPECT_TRUE(deepspeed_differences(mics, 16).empty());
  mics.qwz = mics.qgz = true;
  d = deepspeed_differences(mics, 16);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_FALSE(d[0].refuses || d[1].refuses);
  EXPECT_NE(d[0].what.find("drops qwZ under MiCS"), std::string::npos);
  EXPECT_NE(d[1].what.find("drops qgZ under MiCS"), std::string::npos);

  LayoutChoice hpz;
  hpz.hpz_partition_size = 4;
  hpz.qwz = hpz.qgz = true;
  EXPECT_TRUE(deepspeed_differences(hpz, 16).empty());
  hpz.offload_param = OffloadDevice::cpu;
  d = deepspeed_differences(hpz, 16);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].what.find("host memory"), std::string::npos);
  hpz.secondary_on_host = true;  // what DeepSpeed does with parameter offload
  EXPECT_TRUE(deepspeed_differences(hpz, 16).empty());
  hpz.offload_param = OffloadDevice::nvme;
  d = deepspeed_differences(hpz, 16);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].refuses);
  hpz.offload_param = OffloadDevice::none;
  d = deepspeed_differences(hpz, 16);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].what.find("on the GPU"), std::string::npos);

  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  size_t refused_by_deepspeed = 0;
  for (const AdvisedLayout& r : a.ranked) {
    EXPECT_EQ(r.deepspeed, deepspeed_differences(r.choice, 16)) << r.choice.describe(4);
    const bool mics_offload = r.choice.mics_shard_size == 4 && r.choice.offload_optimizer != OffloadDevice::none;
    refused_by_deepspeed += mics_offload;
    if (mics_offload) {
      EXPECT_TRUE(!r.deepspeed.empty() && r.deepspeed[0].refuses) << r.choice.describe(4);
    }
  }
  EXPECT_GT(refused_by_deepspeed, 0u);
  const std::string table = format_advice(a, j.cluster, 50);
  EXPECT_NE(table.find("DeepSpeed refuses this layout: refuses MiCS with replicas and offload_optimizer"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("DeepSpeed runs another layout: drops qwZ under MiCS silently"), std::string::npos) << table;
  EXPECT_NE(table.find("] runtime/zero/mics.py, MiCS_Optimizer.allreduce_mics_shard_grads"), std::string::npos)
      << table;
}

// A GPU too small for a layout keeps it out of the ranking; so does a node whose host memory cannot hold the
// offloaded states. Nothing over a limit is ever ranked.
TEST(LayoutAdvisor, ALayoutThatDoesNotFitIsNeverRanked) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  SeedJob j = seed_job();
  const size_t fitting_at_48 = advise(j).ranked.size();
  j.cluster.gpu_memory_gib = 20;
  j.cluster.gpu_reserved_gib = 0;
  Advice small = advise(j);
  EXPECT_LT(small.ranked.size(), fitting_at_48);
  EXPECT_FALSE(small.not_fitting.empty());
  for (const AdvisedLayout& r : small.ranked) EXPECT_LE(r.gpu_bytes, int64_t{20} << 30) << r.choice.describe(4);
  for (const AdvisedLayout& r : small.not_fitting) {
    EXPECT_NE(r.reason.find("GPU "), std::string::npos) << r.reason;
    EXPECT_NE(r.reason.find(" > 20.00 GiB"), std::string::npos) << r.reason;
  }
  // The printed table names no layout over the limit among the ranked ones.
  const std::string table = format_advice(small, j.cluster, 50);
  const std::string ranked_part = table.substr(0, table.find("do not fit"));
  for (const AdvisedLayout& r : small.not_fitting) {
    EXPECT_EQ(ranked_part.find(edits_line(r)), std::string::npos) << r.choice.describe(4);
  }

  // 8 GiB of GPU: nothing fits (the activations alone are 6.8 GiB).
  j.cluster.gpu_memory_gib = 8;
  small = advise(j);
  EXPECT_TRUE(small.ranked.empty());
  EXPECT_NE(format_advice(small, j.cluster, 50).find(" 0 ranked"), std::string::npos);

  // 24 GiB of host memory per node: the offloads of MiCS/HSDP (100 GiB and more per node) and of plain ZeRO-3's
  // optimizer with parameters (27 GiB) do not fit.
  j = seed_job();
  j.cluster.host_memory_gib = 24;
  j.cluster.host_reserved_gib = 0;
  small = advise(j);
  for (const AdvisedLayout& r : small.ranked) EXPECT_LE(r.host_node_bytes, int64_t{24} << 30);
  bool host_named = false;
  for (const AdvisedLayout& r : small.not_fitting) host_named |= r.reason.find("host ") != std::string::npos;
  EXPECT_TRUE(host_named);
  EXPECT_FALSE(small.user_config_rank.has_value());  // the seed's own config needs 27.15 GiB per node
}

// The engine's checks as the advisor calls them: each verdict names the key.
TEST(LayoutAdvisor, EngineRefusalNamesTheKey) {
  ClusterDesc cluster;
  cluster.nodes = 4;
  cluster.gpus_per_node = 4;
  cluster.source = "c.json";
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  ResolveInputs in;
  in.world_size = 16;
  in.hidden_size = 64;
  in.micro_batch = 1;
  in.grad_accum = 1;
  EXPECT_NE(engine_refusal(c, cluster).find("resolve"), std::string::npos);  // not resolved yet
  resolve(c, in);
  EXPECT_EQ(engine_refusal(c, cluster), "");
  Config hpz = c;
  hpz.zero.hpz_partition_size = 4;
  EXPECT_EQ(engine_refusal(hpz, cluster), "");
  hpz.zero.offload_param.device = OffloadDevice::cpu;  // the secondary partition is filled from the host slices
  EXPECT_EQ(engine_refusal(hpz, cluster), "");
  hpz.zero.hpz_partition_size = 16;  // the whole world: hpZ is off
  EXPECT_EQ(engine_refusal(hpz, cluster), "");
  Config mics = c;
  mics.zero.mics_shard_size = 3;
  EXPECT_NE(engine_refusal(mics, cluster).find("zero_optimization.mics_shard_size: 3"), std::string::npos);
  mics.zero.mics_shard_size = 4;
  mics.zero.mics_hierarchical_params_gather = true;  // a group within one node has no inter-node stage
  EXPECT_NE(engine_refusal(mics, cluster).find("zero_optimization.mics_hierarchical_params_gather"), std::string::npos);
  Config fp32 = c;
  fp32.bf16.enabled = false;
  fp32.zero.quantized_weights = true;
  EXPECT_NE(engine_refusal(fp32, cluster).find("zero_optimization.zero_quantized_weights"), std::string::npos);
}

// Edits keep what they do not touch, create what they set, and take the deprecated boolean offload keys away with
// the section they stand for.
TEST(LayoutAdvisor, ConfigEdits) {
  const std::string text = R"({
    // a comment, and a trailing comma
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "cpu_offload_param": true, "offload_optimizer": {"device": "cpu",
      "buffer_count": 8},},
  })";
  const nlohmann::json j =
      nlohmann::json::parse(apply_config_edits(text,
                                               {{"zero_optimization.zero_hpz_partition_size", "4"},
                                                {"zero_optimization.cpu_offload_param", std::nullopt},
                                                {"zero_optimization.offload_optimizer.device", "\"nvme\""},
                                                {"zero3.qwz_block_size", "512"},
                                                {"absent.key", std::nullopt}},
                                               "t.json"));
  EXPECT_EQ(j["zero_optimization"]["zero_hpz_partition_size"], 4);
  EXPECT_FALSE(j["zero_optimization"].contains("cpu_offload_param"));
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "nvme");
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["buffer_count"], 8);
  EXPECT_EQ(j["zero3"]["qwz_block_size"], 512);
  EXPECT_FALSE(j.contains("absent"));
  EXPECT_EQ(j["bf16"]["enabled"], true);

  auto error = [&](const std::vector<ConfigEdit>& edits) -> std::string {
    try {
      apply_config_edits(text, edits, "t.json");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error({{"bf16.enabled.x", "1"}}).find("t.json: bf16.enabled.x: enabled is boolean, not an object"),
            std::string::npos);
  EXPECT_NE(error({{"bf16.enabled", "{"}}).find("t.json: bf16.enabled: the edit's value { is not JSON"),
            std::string::npos);
  EXPECT_EQ(error({}), "");  // no edits: the text re-read
  try {
    apply_config_edits("{\"a\": 1,, }", {}, "bad.json");
    ADD_FAILURE() << "a JSON syntax error was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

// The deprecated cpu_offload_param form and an nvme path: the advisor's edits go through them, and the nvme
// layouts are enumerated with the config's path.
TEST(LayoutAdvisor, AliasesAndNvmePaths) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  SeedJob j = seed_job();
  j.config_text = R"({
    "bf16": {"enabled": true},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 3, "cpu_offload_param": true,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}
  })";
  const Advice a = advise(j);
  // 7 shapes x 4 quantizations x 3 x 3 offloads.
  EXPECT_EQ(a.ranked.size() + a.not_fitting.size() + a.refused.size(), 252u);
  bool saw_nvme_param = false;
  for (const AdvisedLayout& r : a.ranked) {
    const Config c = edited_config(j, r);
    EXPECT_EQ(c.zero.offload_param.device, r.choice.offload_param) << r.choice.describe(4);
    if (r.choice.offload_param == OffloadDevice::nvme) {
      saw_nvme_param = true;
      EXPECT_EQ(c.zero.offload_param.nvme_path, "/local_nvme");
    }
  }
  EXPECT_TRUE(saw_nvme_param);
  EXPECT_NE(format_advice(a, j.cluster, 1).find("NVMe space is not checked"), std::string::npos);
  for (const AdvisedLayout& r : a.refused) EXPECT_GT(r.choice.hpz_partition_size, 1) << r.reason;
  ASSERT_TRUE(a.user_config_rank.has_value());
  // The alias goes whenever the parameters' offload changes.
  const ConfigEdit alias_removed{"zero_optimization.cpu_offload_param", std::nullopt};
  for (const AdvisedLayout& r : a.ranked) {
    const bool removed = std::find(r.edits.begin(), r.edits.end(), alias_removed) != r.edits.end();
    EXPECT_EQ(removed, r.choice.offload_param != OffloadDevice::cpu) << r.choice.describe(4);
  }
}

TEST(LayoutAdvisor, NamedErrors) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  auto message = [](const SeedJob& j) -> std::string {
    try {
      advise(j);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SeedJob j = seed_job();
  j.cluster.gpu_memory_gib = 0;
  EXPECT_NE(message(j).find("g6e-12xlarge-efa.json: gpu_memory_gib: missing"), std::string::npos) << message(j);
  j = seed_job();
  j.cluster.host_memory_gib = 0;
  EXPECT_NE(message(j).find("g6e-12xlarge-efa.json: host_memory_gib: missing"), std::string::npos) << message(j);
  j = seed_job();
  j.config_text = R"({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4})";
  EXPECT_NE(message(j).find("zero_optimization.stage: 2"), std::string::npos) << message(j);
  j = seed_job();
  j.config_text = R"({"zero_optimization": {"stage": 3, "offload_parm": {}}})";
  EXPECT_NE(message(j).find("offload_parm"), std::string::npos) << message(j);

  // The cluster description's new figures, each named.
  auto cluster_error = [](const std::string& extra) -> std::string {
    const std::string text = R"({"nodes": 2, "gpus_per_node": 2, "gpu_bf16_tflops": 1, "gpu_memory_gb_s": 1,
      "pcie_gb_s": 1, "nic_gbit_s": 1, "cpu_memory_gb_s": 1, "nvme_gb_s": 1, "matmul_efficiency": 1,
      "pcie_efficiency": 1, "nccl_link_efficiency": 1, "collective_efficiency": 1)" +
                             extra + "}";
    try {
      parse_cluster_desc(text, "c.json");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(cluster_error(R"(, "gpu_memory_gib": 48, "gpu_reserved_gib": 2, "host_memory_gib": 384)"), "");
  EXPECT_NE(cluster_error(R"(, "gpu_memory_gib": 48, "gpu_reserved_gib": 48)")
                .find("c.json: gpu_reserved_gib: 48 is not below gpu_memory_gib 48"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"(, "host_reserved_gib": 2)").find("c.json: host_reserved_gib: 2 without host_memory_gib"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"(, "gpu_reserved_gib": -1)").find("c.json: gpu_reserved_gib: -1 is negative"),
            std::string::npos);
  EXPECT_NE(cluster_error(R"(, "host_memory_gib": "lots")").find("c.json: host_memory_gib: expected a number"),
            std::string::npos);
  EXPECT_NE(
      cluster_error(R"(, "collective_overhead_ms": 0)").find("c.json: collective_overhead_ms: 0 is not a positive"),
      std::string::npos);
  EXPECT_NE(cluster_error(R"(, "gpu_memory_gb": 48)").find("unknown field \"gpu_memory_gb\"; did you mean"),
            std::string::npos);

  // Through the command: a cluster description without the memory figures, and a bad model file, each named.
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (!bin) GTEST_SKIP() << "ZERO3_BIN_DIR is not set (run through ctest)";
  const std::string src = source_dir();
  const std::string base = std::string(bin) + "/zero3 plan --advise --config " + src +
                           "/configs/llama-3-8b-stage3.json --seq-len 512 --micro-batch 4 --grad-accum 4";
  int status = 0;
  std::string out = run_command(base + " --model " + src + "/configs/models/llama-3-8b.json --cluster " + src +
                                    "/configs/clusters/sim-4x2-100mbit.json 2>&1",
                                &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find("sim-4x2-100mbit.json: gpu_memory_gib: missing"), std::string::npos) << out;
  char model_path[] = "/tmp/zero3-advise-model-XXXXXX";
  const int fd = mkstemp(model_path);
  ASSERT_GE(fd, 0);
  const std::string bad_model = R"({"hidden_size": 64, "intermediate_size": "wide", "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100})";
  ASSERT_EQ(write(fd, bad_model.data(), bad_model.size()), static_cast<ssize_t>(bad_model.size()));
  close(fd);
  out = run_command(
      base + " --model " + model_path + " --cluster " + src + "/configs/clusters/g6e-12xlarge-efa.json 2>&1", &status);
  std::remove(model_path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find(std::string(model_path) + ": intermediate_size: expected a number"), std::string::npos) << out;

  // A Llama config without a dimension the activations need (the heads size the attention scratch).
  char heads_path[] = "/tmp/zero3-advise-model-XXXXXX";
  const int hfd = mkstemp(heads_path);
  ASSERT_GE(hfd, 0);
  const std::string no_heads = R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "vocab_size": 100})";
  ASSERT_EQ(write(hfd, no_heads.data(), no_heads.size()), static_cast<ssize_t>(no_heads.size()));
  close(hfd);
  out = run_command(
      base + " --model " + heads_path + " --cluster " + src + "/configs/clusters/g6e-12xlarge-efa.json 2>&1", &status);
  std::remove(heads_path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find(std::string(heads_path) + ": num_attention_heads: missing"), std::string::npos) << out;
}

// `zero3 plan --advise` end to end on the seed's job: the table, and the first rows' edits applied to the seed's
// config give files that `zero3 config check` accepts for the seed's world.
TEST(LayoutAdvisor, CommandPrintsTheRankingAndItsEditsPassConfigCheck) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (!bin || source_dir().empty()) GTEST_SKIP() << "ZERO3_BIN_DIR / ZERO3_SOURCE_DIR are not set (run through ctest)";
  const std::string src = source_dir();
  int status = 0;
  const std::string out = run_command(std::string(bin) + "/zero3 plan --advise --no-pipelines --model " + src +
                                          "/configs/models/llama-3-8b.json --config " + src +
                                          "/configs/llama-3-8b-stage3.json --cluster " + src +
                                          "/configs/clusters/g6e-12xlarge-efa.json --seq-len 512 --micro-batch 4 "
                                          "--grad-accum 4 --steps 50 --activation-bytes 7320166404 --top 3 2>/dev/null",
                                      &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("112 layouts of"), std::string::npos) << out;
  EXPECT_NE(out.find("    1  MiCS/HSDP, one node + qwZ"), std::string::npos) << out;
  EXPECT_NE(out.find("refused (never ranked): 0"), std::string::npos) << out;
  EXPECT_NE(out.find("* your config as it is: rank "), std::string::npos) << out;
  // MiCS/HSDP's neighbours and hpZ with qgZ (lower low ends) overlap the first row's range.
  EXPECT_NE(out.find("ranks 2-7, 10-25 reach into rank 1's range"), std::string::npos) << out;
  EXPECT_NE(out.find("more ranked (--top 0 prints them all)"), std::string::npos) << out;

  const SeedJob j = seed_job();
  const Advice a = advise(j);
  for (size_t i = 0; i < 3; ++i) {
    char path[] = "/tmp/zero3-advise-config-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    const std::string text = apply_config_edits(j.config_text, a.ranked[i].edits, j.config_path);
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
    const std::string check = run_command(std::string(bin) + "/zero3 config check " + path +
                                              " --world-size 16 --hidden-size 4096 --micro-batch 4 --grad-accum 4 2>&1",
                                          &status);
    std::remove(path);
    EXPECT_EQ(status, 0) << check;
    EXPECT_NE(check.find("\"mics_shard_size\": 4"), std::string::npos) << check;
  }

  // --write-config writes the first row's config, which is the seed's with the first row's edits.
  char path[] = "/tmp/zero3-advise-written-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string written = run_command(
      std::string(bin) + "/zero3 plan --advise --no-pipelines --model " + src +
          "/configs/models/llama-3-8b.json --config " + src + "/configs/llama-3-8b-stage3.json --cluster " + src +
          "/configs/clusters/g6e-12xlarge-efa.json --seq-len 512 --micro-batch 4 --grad-accum 4 "
          "--activation-bytes 7320166404 --top 1 --write-config " +
          path + " 2>&1",
      &status);
  ASSERT_EQ(status, 0) << written;
  EXPECT_NE(written.find(std::string("wrote ") + path + ": MiCS/HSDP, one node + qwZ"), std::string::npos) << written;
  std::ifstream in(path);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  EXPECT_EQ(file, apply_config_edits(j.config_text, a.ranked[0].edits, j.config_path) + "\n");
}

// --write-config --pick N writes ranked row N, and refuses a row past the last that fits; the flags that need another
// one are named. `zero3 plan --seq-len` counts the same activations as the advisor; a unit list cannot give them.
// With llama3_train built beside zero3, its --dry-run prints the same activation bytes for the written config.
TEST(LayoutAdvisor, PickWritesAnyRankedRowAndTheDryRunAgrees) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (!bin || source_dir().empty()) GTEST_SKIP() << "ZERO3_BIN_DIR / ZERO3_SOURCE_DIR are not set (run through ctest)";
  const std::string src = source_dir();
  const std::string model = src + "/configs/models/llama-3-8b.json", config = src + "/configs/llama-3-8b-stage3.json";
  const std::string advise_cmd = std::string(bin) + "/zero3 plan --advise --no-pipelines --model " + model +
                                 " --config " + config + " --cluster " + src +
                                 "/configs/clusters/g6e-12xlarge-efa.json --seq-len 512 --micro-batch 4 "
                                 "--grad-accum 4 --no-grad-checkpointing --top 1";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  ASSERT_GE(a.ranked.size(), 2u);
  char path[] = "/tmp/zero3-advise-pick-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  int status = 0;
  std::string out = run_command(advise_cmd + " --write-config " + path + " --pick 2 2>&1", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("activations: 6.82 GiB per GPU, micro-batch 4 x seq 512, activation checkpointing off"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(std::string("wrote ") + path + ": " + a.ranked[1].choice.describe(4) + ", ranked 2"),
            std::string::npos)
      << out;
  {
    std::ifstream in(path);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(file, apply_config_edits(j.config_text, a.ranked[1].edits, j.config_path) + "\n");
  }

  // Past the last row that fits: refused, named, and nothing written over the file.
  const std::string past = std::to_string(a.ranked.size() + 1);
  std::remove(path);
  out = run_command(advise_cmd + " --write-config " + path + " --pick " + past + " 2>&1", &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find("--pick " + past + ": only " + std::to_string(a.ranked.size()) + " layouts fit"),
            std::string::npos)
      << out;
  EXPECT_NE(access(path, F_OK), 0) << "a file was written for a row that does not exist";
  out = run_command(advise_cmd + " --pick 2 2>&1", &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << out;
  EXPECT_NE(out.find("--pick goes with --write-config"), std::string::npos) << out;
  out = run_command(advise_cmd + " --write-config " + path + " --pick 0 2>&1", &status);
  EXPECT_NE(out.find("--pick: expected a ranked row, 1 or more, got '0'"), std::string::npos) << out;

  // The memory plan of the written config counts the same activations.
  ASSERT_EQ(run_command(advise_cmd + " --write-config " + path + " 2>&1", &status).empty(), false);
  ASSERT_EQ(status, 0);
  const std::string plan_cmd = std::string(bin) + "/zero3 plan --model " + model + " --config " + path +
                               " --world-size 16 --ranks-per-node 4 --seq-len 512 --micro-batch 4 --grad-accum 4 "
                               "--no-grad-checkpointing 2>&1";
  const std::string plan = run_command(plan_cmd, &status);
  EXPECT_EQ(status, 0) << plan;
  EXPECT_NE(plan.find("activations per rank: " + std::to_string(kSeedActivationBytes) + " bytes"), std::string::npos)
      << plan;
  const std::string llama3_train = std::string(bin) + "/llama3_train";
  if (access(llama3_train.c_str(), X_OK) == 0) {
    // Both print the memory plan's table; its activations row is the same line.
    const std::string dry =
        run_command(llama3_train + " --dry-run --model " + model + " --deepspeed " + path +
                        " --world-size 16 --ranks-per-node 4 --seq-len 512 --micro-batch 4 --grad-accum 4 "
                        "--device cuda --no-grad-checkpointing 2>&1",
                    &status);
    EXPECT_EQ(status, 0) << dry;
    auto activations_row = [](const std::string& text) {
      const size_t at = text.find("\nactivations  ");  // the table row, not the estimate's line
      return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
    };
    EXPECT_FALSE(activations_row(plan).empty()) << plan;
    EXPECT_EQ(activations_row(dry), activations_row(plan)) << dry;
  }
  std::remove(path);

  // A unit list has no dimensions to estimate activations from.
  char units_path[] = "/tmp/zero3-advise-units-XXXXXX";
  const int ufd = mkstemp(units_path);
  ASSERT_GE(ufd, 0);
  const std::string units = R"({"units": [{"name": "layer.0", "params": [[64, 64]]}]})";
  ASSERT_EQ(write(ufd, units.data(), units.size()), static_cast<ssize_t>(units.size()));
  close(ufd);
  out = run_command(std::string(bin) + "/zero3 plan --model " + units_path + " --config " + config +
                        " --world-size 4 --seq-len 512 --micro-batch 4 --grad-accum 4 2>&1",
                    &status);
  std::remove(units_path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_NE(out.find(std::string(units_path) + ": --seq-len estimates the activations from a Hugging Face Llama"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace zero3

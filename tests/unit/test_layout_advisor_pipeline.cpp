// The layout advisor's pipelined rows (zero3/layout_advisor.hpp, zero3/pipeline_plan.hpp) on the seed's job:
// Llama-3-8B, micro-batch 4 x seq 512, 4 accumulation steps, on 4 x g6e.12xlarge (4 L40S each) over EFA or TCP.
// Every pipelined row is what its edits make (the config they produce, resolved with the row's accumulation steps,
// plans and times to the row's figures), keeps the seed's global batch, and names what the program must do; the
// answer's first rows with their figures; `zero3 plan --advise` and --write-config end to end.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "support/run_command.hpp"
#include "zero3/cluster_desc.hpp"
#include "zero3/error.hpp"
#include "zero3/layout_advisor.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/pipeline_plan.hpp"
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

struct SeedJob {
  std::string config_path, config_text;
  ModelDesc model;
  LlamaDims dims;
  ClusterDesc cluster;
  AdviseOptions options;
};

// The seed's job as test_layout_advisor.cpp asks it, pipelined layouts included.
SeedJob seed_job(const std::string& cluster_file = "g6e-12xlarge-efa.json") {
  SeedJob j;
  const std::string src = source_dir();
  j.config_path = src + "/configs/llama-3-8b-stage3.json";
  j.config_text = read_text(j.config_path);
  int64_t hidden = 0;
  j.model = load_model_desc(src + "/configs/models/llama-3-8b.json", &hidden, &j.dims);
  j.cluster = load_cluster_desc(src + "/configs/clusters/" + cluster_file);
  j.options.seq_len = 512;
  j.options.checkpointing = false;
  j.options.inputs.micro_batch = 4;
  j.options.inputs.grad_accum = 4;
  j.options.inputs.hidden_size = hidden;
  return j;
}

Advice advise(const SeedJob& j) {
  return advise_layouts(j.config_text, j.config_path, j.model, j.dims, j.cluster, j.options);
}

bool pipelined(const AdvisedLayout& a) { return a.choice.pipeline_stages > 1; }

// A pipelined row's config: its edits, resolved with the accumulation steps that keep the seed's global batch of
// 4 x 4 x 16 = 256 (the program's --grad-accum, which the seed's "auto" takes).
Config edited_config(const SeedJob& j, const AdvisedLayout& a) {
  Config c = parse_config(apply_config_edits(j.config_text, a.edits, j.config_path), "edited");
  ResolveInputs in = j.options.inputs;
  in.world_size = j.cluster.world();
  in.grad_accum = 4 * a.choice.pipeline_stages;
  resolve(c, in);
  return c;
}

TEST(LayoutAdvisorPipeline, EveryPipelinedRowIsWhatItsEditsMake) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  // 112 unpipelined layouts; pipelined: 2, 4, 8, 16 stages x (1f1b, interleaved x2) x (ZeRO-1, -2: optimizer offload
  // or not; ZeRO-3: both offloads or not) = 4 x 2 x 8.
  ASSERT_EQ(a.ranked.size() + a.not_fitting.size() + a.refused.size(), 112u + 64u);
  size_t rows = 0;
  for (const AdvisedLayout& r : a.ranked) {
    if (!pipelined(r)) continue;
    ++rows;
    SCOPED_TRACE(r.choice.describe(4, 16));
    const Config c = edited_config(j, r);
    EXPECT_EQ(*c.pipeline.stages, r.choice.pipeline_stages);
    EXPECT_EQ(c.zero.stage, r.choice.zero_stage);
    EXPECT_EQ(c.zero3.pipeline_schedule, r.choice.pipeline_schedule);
    EXPECT_EQ(c.zero3.pipeline_virtual_stages, r.choice.virtual_stages);
    EXPECT_EQ(*c.train_batch_size, 256);  // the seed's global batch
    EXPECT_EQ(*c.gradient_accumulation_steps, 4 * r.choice.pipeline_stages);
    EXPECT_EQ(engine_refusal(c, j.cluster), "");
    EXPECT_NE(r.note.find("llama3_train --pipeline-stages " + std::to_string(r.choice.pipeline_stages)),
              std::string::npos)
        << r.note;
    EXPECT_NE(r.note.find("--grad-accum " + std::to_string(4 * r.choice.pipeline_stages)), std::string::npos);
    EXPECT_NE(r.note.find("the same global batch of 256"), std::string::npos);
    // The plans of that config: the worst rank's GPU bytes and the step.
    PipelinePlanOptions o;
    o.world_size = 16;
    o.ranks_per_node = 4;
    o.boundary_numel = 4 * 512 * 4096;
    o.dims = j.dims;
    o.activations = a.activations;
    o.checkpointing = false;
    const PipelinePlan plan = plan_pipeline(j.model, c, o);
    EXPECT_EQ(plan.ranks[plan.worst_rank()].memory.rank_bytes(MemoryTier::device), r.gpu_bytes);
    EXPECT_LE(r.gpu_bytes + a.gpu_headroom_bytes, a.gpu_plan_bytes);
    EXPECT_DOUBLE_EQ(plan.bubble, r.bubble);
    StepTimeOptions timing;
    timing.seq_len = 512;
    const PipelineStepTime t = model_pipeline_step_time(j.model, j.dims, c, j.cluster, timing);
    EXPECT_DOUBLE_EQ(t.time.step_s, r.time.step_s);
    EXPECT_DOUBLE_EQ(t.time.step_fixed_s, r.time.step_fixed_s);
    // DeepSpeed's pipeline engine takes ZeRO-1 and 1F1B only.
    const bool deepspeed_runs = r.choice.zero_stage == 1 && r.choice.pipeline_schedule == "1f1b";
    EXPECT_EQ(r.deepspeed.empty(), deepspeed_runs);
  }
  EXPECT_GT(rows, 0u);
}

// The seed's answer with pipelines (docs/performance-model.md, "Pipelined layouts for the seed's job"): 4 stages
// across the nodes, 1F1B, ZeRO-2 inside each node, no offload, ranks first by both readings: 3.41-3.51 s a step at
// the seed's global batch of 256 (16 micro-batches, bubble 3/19), against 9.01-11.50 s for the first unpipelined
// row (MiCS/HSDP + qwZ + qgZ, both offloads), whose node link carries 24.09 GB a step against the pipeline's
// 2.15 GB (the stage boundaries' activations and gradients, 16 MiB per micro-batch each way; ZeRO stays on the
// node). Its worst rank (the first: the embedding, 7 layers and 4 micro-batches in flight) takes 20.16 GiB. DeepSpeed
// refuses it (ZeRO-2 inside a pipeline); the second row, ZeRO-1, is the first DeepSpeed runs: 3.68-3.79 s. 52
// pipelined rows (all 48 of 4, 8 and 16 stages, 4 of 2) rank before the first unpipelined one; over TCP the answer is
// the same row, 3.76-4.07 s, against MiCS/HSDP's 11.30-17.75 s.
TEST(LayoutAdvisorPipeline, TheSeedsAnswer) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  EXPECT_EQ(a.ranked.size(), 169u);
  EXPECT_EQ(a.not_fitting.size(), 7u);  // the unpipelined answer's seven MiCS/HSDP layouts
  EXPECT_EQ(a.refused.size(), 0u);
  const AdvisedLayout& first = a.ranked[0];
  EXPECT_EQ(first.choice.pipeline_stages, 4);
  EXPECT_EQ(first.choice.pipeline_schedule, "1f1b");
  EXPECT_EQ(first.choice.zero_stage, 2);
  EXPECT_EQ(first.choice.offload_optimizer, OffloadDevice::none);
  EXPECT_EQ(first.choice.offload_param, OffloadDevice::none);
  EXPECT_EQ(first.edits, (std::vector<ConfigEdit>{{"zero_optimization.offload_optimizer", std::nullopt},
                                                  {"zero_optimization.offload_param", std::nullopt},
                                                  {"zero_optimization.stage", "2"},
                                                  {"pipeline.stages", "4"}}));
  EXPECT_NEAR(first.bubble, 3.0 / 19, 1e-12);
  EXPECT_NEAR(first.time.step_low_s(), 3.41, 0.005);
  EXPECT_NEAR(first.time.step_high_s(), 3.51, 0.005);
  EXPECT_EQ(first.time.node_inter_bytes, int64_t{2} * 4 * 16 * (4 * 512 * 4096 * 2));  // 2,147,483,648
  EXPECT_NEAR(static_cast<double>(first.gpu_bytes) / (1 << 30), 20.16, 0.005);
  EXPECT_EQ(first.rank_bandwidth, 1u);
  EXPECT_EQ(first.rank_fixed_cost, 1u);
  EXPECT_FALSE(a.readings.has_value());  // both readings put it first
  ASSERT_EQ(first.deepspeed.size(), 1u);
  EXPECT_TRUE(first.deepspeed[0].refuses);

  const AdvisedLayout& second = a.ranked[1];
  EXPECT_EQ(second.choice.pipeline_stages, 4);
  EXPECT_EQ(second.choice.zero_stage, 1);
  EXPECT_TRUE(second.deepspeed.empty());
  EXPECT_NEAR(second.time.step_low_s(), 3.68, 0.005);
  EXPECT_NEAR(second.time.step_high_s(), 3.79, 0.005);

  size_t first_unpipelined = 0;
  while (first_unpipelined < a.ranked.size() && pipelined(a.ranked[first_unpipelined])) ++first_unpipelined;
  ASSERT_EQ(first_unpipelined, 52u);
  const AdvisedLayout& mics = a.ranked[first_unpipelined];
  EXPECT_EQ(mics.choice.mics_shard_size, 4);
  EXPECT_TRUE(mics.choice.qwz && mics.choice.qgz);
  EXPECT_NEAR(mics.time.step_high_s(), 11.50, 0.005);
  EXPECT_NEAR(static_cast<double>(mics.time.node_inter_bytes) / 1e9, 24.09, 0.005);
  EXPECT_GT(mics.time.node_inter_bytes, 11 * first.time.node_inter_bytes);
  ASSERT_TRUE(a.user_config_rank.has_value());
  EXPECT_EQ(*a.user_config_rank, 157u);

  // Over TCP: the same first row.
  const SeedJob tcp = seed_job("g6e-12xlarge-tcp.json");
  const Advice t = advise(tcp);
  EXPECT_EQ(t.ranked[0].choice, first.choice);
  EXPECT_NEAR(t.ranked[0].time.step_low_s(), 3.76, 0.005);
  EXPECT_NEAR(t.ranked[0].time.step_high_s(), 4.07, 0.005);
  for (const AdvisedLayout& r : t.ranked) {
    if (pipelined(r)) continue;
    EXPECT_NEAR(r.time.step_high_s(), 17.75, 0.005);
    break;
  }
}

// The seed's config with its batch written out (train_batch_size 256, micro-batch 4, 4 accumulation steps): a
// pipelined row edits gradient_accumulation_steps to keep the batch, and its note names no --grad-accum.
TEST(LayoutAdvisorPipeline, ANumericBatchIsEdited) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  SeedJob j = seed_job();
  j.config_text = apply_config_edits(
      j.config_text,
      {{"train_batch_size", "256"}, {"train_micro_batch_size_per_gpu", "4"}, {"gradient_accumulation_steps", "4"}},
      j.config_path);
  j.options.inputs.micro_batch.reset();
  j.options.inputs.grad_accum.reset();
  const Advice a = advise(j);
  const AdvisedLayout& first = a.ranked[0];
  ASSERT_EQ(first.choice.pipeline_stages, 4);
  EXPECT_NE(std::find(first.edits.begin(), first.edits.end(), ConfigEdit{"gradient_accumulation_steps", "16"}),
            first.edits.end());
  EXPECT_EQ(first.note.find("--grad-accum"), std::string::npos) << first.note;
  EXPECT_EQ(*first.config.gradient_accumulation_steps, 16);
  EXPECT_EQ(*first.config.train_batch_size, 256);
  // Without pipelines the answer is the unpipelined one.
  j.options.pipelines = false;
  const Advice plain = advise(j);
  for (const AdvisedLayout& r : plain.ranked) EXPECT_FALSE(pipelined(r));
}

// `zero3 plan --advise` prints the pipelined rows with their notes; --write-config writes the first row's pipeline
// keys, which `zero3 config check` takes with the row's --grad-accum; `zero3 plan` plans that config per pipeline rank
// and `zero3 plan --cluster` times it as a pipeline.
TEST(LayoutAdvisorPipeline, CommandWritesAPipelinedConfigThatChecksAndPlans) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (!bin || source_dir().empty()) GTEST_SKIP() << "ZERO3_BIN_DIR / ZERO3_SOURCE_DIR are not set (run through ctest)";
  const std::string src = source_dir(), zero3 = std::string(bin) + "/zero3";
  const std::string model = " --model " + src + "/configs/models/llama-3-8b.json";
  const std::string cluster = " --cluster " + src + "/configs/clusters/g6e-12xlarge-efa.json";
  char path[] = "/tmp/zero3-advise-pipeline-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  int status = 0;
  const std::string out =
      run_command(zero3 + " plan --advise" + model + " --config " + src + "/configs/llama-3-8b-stage3.json" + cluster +
                      " --seq-len 512 --micro-batch 4 --grad-accum 4 --no-grad-checkpointing "
                      "--top 2 --write-config " +
                      path + " 2>&1",
                  &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("176 layouts of"), std::string::npos) << out;
  EXPECT_NE(out.find("    1  pipeline 4 x 1f1b, ZeRO-2, one node"), std::string::npos) << out;
  EXPECT_NE(out.find("pipelined: bubble 0.158; the program splits its model into 4 stages (llama3_train "
                     "--pipeline-stages 4) and accumulates 16 micro-batches (--grad-accum 16): the same global batch "
                     "of 256"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("runtime/pipe/engine.py, PipelineEngine.__init__"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string("wrote ") + path + ": pipeline 4 x 1f1b, ZeRO-2, one node; no offload, ranked 1"),
            std::string::npos)
      << out;
  std::ifstream in(path);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(file.find("\"pipeline\": {\n        \"stages\": 4"), std::string::npos) << file;

  const std::string check = run_command(
      zero3 + " config check " + path + " --world-size 16 --hidden-size 4096 --micro-batch 4 --grad-accum 16 2>&1",
      &status);
  EXPECT_EQ(status, 0) << check;
  const std::string plan = run_command(zero3 + " plan" + model + " --config " + path +
                                           " --world-size 16 --ranks-per-node 4 --seq-len 512 --micro-batch 4 "
                                           "--grad-accum 16 --no-grad-checkpointing 2>&1",
                                       &status);
  EXPECT_EQ(status, 0) << plan;
  EXPECT_NE(plan.find("zero3 pipeline plan: 4 pipeline ranks x 1 stage(s) per rank, 1f1b, 16 micro-batches"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("worst rank: 0 (20.16 GiB on the device)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("node 1: 2,147,483,648 to other nodes per step (2,147,483,648 of it stage boundaries)"),
            std::string::npos)
      << plan;
  const std::string time = run_command(zero3 + " plan" + model + " --config " + path + cluster +
                                           " --seq-len 512 --micro-batch 4 --grad-accum 16 --steps 50 2>&1",
                                       &status);
  std::remove(path);
  EXPECT_EQ(status, 0) << time;
  EXPECT_NE(time.find("pipeline 4 x 1f1b, ZeRO-2 over 4 ranks: 16 micro-batches, bubble 0.1579"), std::string::npos)
      << time;
  EXPECT_NE(time.find("step 3.41-3.51 s, 50 steps 170-176 s"), std::string::npos) << time;
}

}  // namespace
}  // namespace zero3

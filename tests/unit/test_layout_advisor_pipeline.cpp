// The layout advisor's pipelined rows (zero3/layout_advisor.hpp, zero3/pipeline_plan.hpp) on the seed's job:
// Llama-3-8B, micro-batch 4 x seq 512, 4 accumulation steps, on 4 x g6e.12xlarge (4 L40S each) over EFA or TCP.
// Every pipelined row is what its edits make (the config they produce, resolved with the row's accumulation steps,
// plans and times to the row's figures), keeps the seed's global batch, and names what the program must do; the
// answer's first rows with their figures; `zero3 plan --advise` and --write-config end to end.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <unistd.h>
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

Advice advise(const SeedJob& j) { return advise_layouts(j.config_text, j.config_path, j.model, j.dims, j.cluster, j.options); }

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

TEST(LayoutAdvisorPipeline, TheSeedsAnswer) {
  if (source_dir().empty()) GTEST_SKIP() << "ZERO3_SOURCE_DIR is not set (run through ctest)";
  const SeedJob j = seed_job();
  const Advice a = advise(j);
  ASSERT_FALSE(a.ranked.empty());
  for (size_t i = 0; i < std::min<size_t>(a.ranked.size(), 12); ++i) {
    const AdvisedLayout& r = a.ranked[i];
    std::printf("%2zu %-44s %-5s %-5s gpu %.2f GiB  step %.2f-%.2f s  node link %.3f GB  bubble %.3f  %s\n", i + 1,
                r.choice.layout(4, 16).c_str(), r.choice.offload_optimizer == OffloadDevice::none ? "GPU" : "cpu",
                r.choice.offload_param == OffloadDevice::none ? "GPU" : "cpu",
                static_cast<double>(r.gpu_bytes) / (1 << 30), r.time.step_low_s(), r.time.step_high_s(),
                static_cast<double>(r.time.node_inter_bytes) / 1e9, r.bubble, r.time.bound.c_str());
  }
}

}  // namespace
}  // namespace zero3

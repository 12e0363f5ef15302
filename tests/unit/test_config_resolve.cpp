// resolve(): "auto" as Hugging Face fills it, DeepSpeed's batch inference and consistency rule, the
// program-vs-config checks, and check_runtime_paths().
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero3/config.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

Config resolved(const std::string& text, const ResolveInputs& in) {
  Config c = parse_config(text, "r.json");
  resolve(c, in);
  return c;
}

std::string resolve_error(const std::string& text, const ResolveInputs& in, const std::vector<std::string>& parts) {
  Config c = parse_config(text, "r.json");
  try {
    resolve(c, in);
  } catch (const ConfigError& e) {
    std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
    return m;
  }
  ADD_FAILURE() << "no ConfigError for: " << text;
  return "";
}

// Whether the written config still holds an "auto" outside the zero3 section.
bool has_auto(const std::string& written) {
  nlohmann::json j = nlohmann::json::parse(written);
  j.erase("zero3");
  return j.dump().find("\"auto\"") != std::string::npos;
}

constexpr const char* kSeed = R"({
    "fp16": { "enabled": false },
    "bf16": { "enabled": true },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": { "device": "cpu", "pin_memory": true },
        "offload_param": { "device": "cpu", "pin_memory": true },
        "overlap_comm": true,
        "contiguous_gradients": true,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": false
    },
    "gradient_clipping": "auto",
    "steps_per_print": 10,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "wall_clock_breakdown": false
})";

ResolveInputs seed_run() {
  ResolveInputs in;
  in.world_size = 16;  // 4 nodes x 4 L40S
  in.hidden_size = 4096;
  in.micro_batch = 4;
  in.grad_accum = 4;
  in.precision = DType::bf16;
  return in;
}

}  // namespace

TEST(ConfigResolve, SeedRunResolvesLikeHuggingFace) {
  Config c = resolved(kSeed, seed_run());
  EXPECT_TRUE(c.resolved);
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096 * 4096);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 15099494) << "int(0.9 * 4096 * 4096)";
  EXPECT_EQ(c.zero.param_persistence_threshold, 40960);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.train_batch_size, 256) << "the seed's log: Total train batch size = 256";
  // The written config has no "auto" left (zero3's own section has "auto" as a value of its choices).
  EXPECT_FALSE(has_auto(to_json(c))) << to_json(c);
  // Before resolution it shows them.
  EXPECT_NE(to_json(parse_config(kSeed)).find("\"reduce_bucket_size\": \"auto\""), std::string::npos);
}

TEST(ConfigResolve, HiddenSizeRuleMatchesPythonArithmetic) {
  // int(0.9 * h * h) in Python evaluates (0.9 * h) * h in double precision, then truncates.
  const char* text = R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}, "train_batch_size": 1})";
  struct Case {
    int64_t h, prefetch;
  } cases[] = {{4096, 15099494}, {768, 530841}, {1024, 943718}, {5120, 23592960}, {8192, 60397977}, {7, 44}};
  for (const Case& k : cases) {
    ResolveInputs in;
    in.hidden_size = k.h;
    Config c = resolved(text, in);
    EXPECT_EQ(c.zero.prefetch_bucket_size, k.prefetch) << k.h;
    EXPECT_EQ(c.zero.reduce_bucket_size, k.h * k.h);
    EXPECT_EQ(c.zero.param_persistence_threshold, 10 * k.h);
  }
}

TEST(ConfigResolve, Stage3KeysBelowStage3TakeDeepSpeedDefaults) {
  ResolveInputs in;
  in.hidden_size = 1024;
  Config c = resolved(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}, "train_batch_size": 1})",
                      in);
  EXPECT_EQ(c.zero.reduce_bucket_size, 1024 * 1024);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000);
}

TEST(ConfigResolve, UnresolvableAutoSaysWhatToPass) {
  ResolveInputs in = seed_run();
  in.hidden_size.reset();
  resolve_error(kSeed, in,
                {"zero_optimization.reduce_bucket_size", "\"auto\" needs the model's hidden size", "--hidden-size",
                 "(in r.json)"});
  in = seed_run();
  in.micro_batch.reset();
  resolve_error(kSeed, in, {"train_micro_batch_size_per_gpu", "--micro-batch"});
  in = seed_run();
  in.grad_accum.reset();
  resolve_error(kSeed, in, {"gradient_accumulation_steps", "--grad-accum"});
  resolve_error(R"({"bf16": {"enabled": "auto"}, "train_batch_size": 8})", {}, {"bf16.enabled", "--precision"});
  resolve_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "train_batch_size": 8})", {},
                {"optimizer.params.lr", "--lr"});
  resolve_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}, "train_batch_size": 8})",
                {}, {"scheduler.params.warmup_num_steps", "--warmup-steps"});
  resolve_error(
      R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}, "train_batch_size": 8})", {},
      {"scheduler.params.total_num_steps", "--total-steps"});
  resolve_error(R"({"train_batch_size": "auto"})", {}, {"train_batch_size", "micro batch is unknown", "--micro-batch"});
}

TEST(ConfigResolve, PrecisionAuto) {
  const char* text = R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "train_batch_size": 8})";
  ResolveInputs in;
  in.precision = DType::bf16;
  Config c = resolved(text, in);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  in.precision = DType::f16;
  c = resolved(text, in);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(c.fp16.enabled);
  in.precision = DType::f32;
  c = resolved(text, in);
  EXPECT_EQ(c.compute_dtype(), DType::f32);
  EXPECT_NE(to_json(c).find("\"enabled\": false"), std::string::npos);
}

TEST(ConfigResolve, PrecisionMismatchIsAnError) {
  ResolveInputs in;
  in.precision = DType::f32;
  resolve_error(R"({"bf16": {"enabled": true}, "train_batch_size": 8})", in,
                {"bf16.enabled", "got true", "program runs in fp32", "\"auto\""});
  in.precision = DType::bf16;
  resolve_error(R"({"fp16": {"enabled": true}, "train_batch_size": 8})", in, {"fp16.enabled", "got true"});
  resolve_error(R"({"bf16": {"enabled": false}, "train_batch_size": 8})", in,
                {"bf16.enabled", "selects fp32", "program runs in bf16"});
  in.precision = DType::f16;
  resolve_error(R"({"fp16": {"enabled": false}, "train_batch_size": 8})", in,
                {"fp16.enabled", "selects fp32", "program runs in fp16"});
  in.precision = DType::bf16;
  // Matching values pass.
  EXPECT_NO_THROW(resolved(R"({"bf16": {"enabled": true}, "train_batch_size": 8})", in));
}

TEST(ConfigResolve, GradientClippingAuto) {
  EXPECT_EQ(resolved(R"({"gradient_clipping": "auto", "train_batch_size": 8})", {}).gradient_clipping, 1.0);
  ResolveInputs in;
  in.max_grad_norm = 0.3;
  EXPECT_EQ(resolved(R"({"gradient_clipping": "auto", "train_batch_size": 8})", in).gradient_clipping, 0.3);
  EXPECT_EQ(resolved(R"({"gradient_clipping": 2.0, "train_batch_size": 8})", in).gradient_clipping, 2.0)
      << "explicit values stay";
}

TEST(ConfigResolve, OptimizerAndSchedulerAuto) {
  // Hugging Face's documented ZeRO-3 config, all "auto".
  const char* text = R"({
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
  })";
  ResolveInputs in;
  in.world_size = 2;
  in.hidden_size = 64;
  in.micro_batch = 3;
  in.grad_accum = 5;
  in.precision = DType::bf16;
  in.lr = 3e-4;
  in.weight_decay = 0.1;
  in.adam_beta1 = 0.85;
  in.adam_beta2 = 0.98;
  in.adam_epsilon = 1e-6;
  in.total_steps = 500;
  in.warmup_steps = 20;
  in.max_grad_norm = 0.5;
  Config c = resolved(text, in);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.optimizer.beta1, 0.85);
  EXPECT_EQ(c.optimizer.beta2, 0.98);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 20);
  EXPECT_EQ(c.scheduler.total_num_steps, 500);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(c.train_batch_size, 30);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096);
  EXPECT_FALSE(has_auto(to_json(c))) << to_json(c);

  // Without the program's optional values: Hugging Face's defaults.
  ResolveInputs less = in;
  less.weight_decay.reset();
  less.adam_beta1.reset();
  less.adam_beta2.reset();
  less.adam_epsilon.reset();
  c = resolved(text, less);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
}

TEST(ConfigResolve, WarmupLrMaxFollowsTheLearningRate) {
  const char* text = R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
                         "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}, "train_batch_size": 1})";
  EXPECT_EQ(resolved(text, {}).scheduler.warmup_max_lr, 0.002);
  // No optimizer section: the program's optimizer and learning rate.
  ResolveInputs in;
  in.lr = 5e-5;
  Config c = resolved(R"({"scheduler": {"type": "WarmupLR"}, "train_batch_size": 1})", in);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.optimizer.lr, 5e-5);
}

TEST(ConfigResolve, BatchInferenceFollowsDeepSpeed) {
  struct Case {
    const char* text;
    int64_t world, tb, mb, ga;
  } cases[] = {
      {R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})", 16, 256,
       4, 4},
      {R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4})", 16, 256, 4, 4},
      {R"({"train_batch_size": 256, "gradient_accumulation_steps": 4})", 16, 256, 4, 4},
      {R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})", 16, 256, 4, 4},
      {R"({"train_batch_size": 48})", 3, 48, 16, 1},
      {R"({"train_micro_batch_size_per_gpu": 10})", 3, 30, 10, 1},
      {R"({"train_micro_batch_size_per_gpu": 1})", 1, 1, 1, 1},
  };
  for (const Case& k : cases) {
    ResolveInputs in;
    in.world_size = k.world;
    Config c = resolved(k.text, in);
    EXPECT_EQ(c.train_batch_size, k.tb) << k.text;
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, k.mb) << k.text;
    EXPECT_EQ(c.gradient_accumulation_steps, k.ga) << k.text;
  }
}

TEST(ConfigResolve, BatchTripleInconsistentWithWorldSize) {
  ResolveInputs in;
  in.world_size = 8;
  resolve_error(R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})",
                in,
                {"train_batch_size", "got 256", "train_micro_batch_size_per_gpu 4", "gradient_accumulation_steps 4",
                 "world size 8", "= 128"});
  in.world_size = 3;
  resolve_error(R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 4})", in,
                {"train_batch_size", "got 100", "gradient_accumulation_steps 8 (inferred)", "= 96"});
  in.world_size = 16;
  resolve_error(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4})", in,
                {"train_batch_size", "got 8", "gradient_accumulation_steps 0 (inferred)"});
  resolve_error(R"({"train_batch_size": 8})", in, {"train_batch_size", "train_micro_batch_size_per_gpu 0 (inferred)"});
  resolve_error(R"({"gradient_accumulation_steps": 2})", {}, {"train_batch_size", "missing", "--micro-batch"});
  resolve_error(R"({})", {}, {"train_batch_size", "missing"});
  ResolveInputs bad;
  bad.world_size = 0;
  resolve_error(R"({"train_batch_size": 8})", bad, {"world size", "got 0"});
}

TEST(ConfigResolve, ProgramValuesFillAndMustAgree) {
  ResolveInputs in;
  in.world_size = 2;
  in.micro_batch = 4;
  in.grad_accum = 2;
  // Absent keys take the program's values.
  Config c = resolved("{}", in);
  EXPECT_EQ(c.train_batch_size, 16);
  // An explicit value that differs is an error, as in Hugging Face's integration.
  resolve_error(R"({"train_micro_batch_size_per_gpu": 8})", in,
                {"train_micro_batch_size_per_gpu", "got 8", "program passes 4", "--micro-batch"});
  resolve_error(R"({"gradient_accumulation_steps": 3})", in, {"gradient_accumulation_steps", "got 3", "passes 2"});
  resolve_error(R"({"train_batch_size": 32})", in, {"train_batch_size", "got 32", "= 16"});
}

TEST(ConfigResolve, NvmeNeedsAPath) {
  ResolveInputs in;
  resolve_error(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
                in, {"zero_optimization.offload_param.nvme_path", "missing", "/tmp/zero3-nvme", "ZERO3_SWAP_DIR"});
  resolve_error(
      R"({"train_batch_size": 1, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme"}}})", in,
      {"zero_optimization.offload_optimizer.nvme_path", "missing"});
}

TEST(ConfigResolve, RuntimePaths) {
  std::string dir = testing::TempDir() + "zero3_nvme_check";
  ::mkdir(dir.c_str(), 0755);
  std::string text = R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                     dir + R"("}, "offload_optimizer": {"device": "cpu"}}})";
  Config c = resolved(text, {});
  EXPECT_NO_THROW(check_runtime_paths(c));

  c.zero.offload_param.nvme_path = dir + "/missing";
  try {
    check_runtime_paths(c);
    ADD_FAILURE() << "missing directory accepted";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("zero_optimization.offload_param.nvme_path: ", 0), 0u) << m;
    EXPECT_NE(m.find(dir + "/missing"), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
    EXPECT_NE(m.find("mkdir -p"), std::string::npos) << m;
  }

  std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  c.zero.offload_param.nvme_path = file;
  try {
    check_runtime_paths(c);
    ADD_FAILURE() << "a file accepted as a directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
  std::remove(file.c_str());

  if (::geteuid() != 0) {  // root may write anywhere
    std::string ro = dir + "/read-only";
    ::mkdir(ro.c_str(), 0555);
    c.zero.offload_param.nvme_path = ro;
    try {
      check_runtime_paths(c);
      ADD_FAILURE() << "read-only directory accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is not writable"), std::string::npos) << e.what();
    }
    ::rmdir(ro.c_str());
  }
  ::rmdir(dir.c_str());
}

TEST(ConfigResolve, WrittenConfigReadsBackToItself) {
  Config c = resolved(kSeed, seed_run());
  std::string once = to_json(c);
  Config again = parse_config(once, "again.json");
  resolve(again, seed_run());
  EXPECT_EQ(to_json(again), once);
  // A resolved config needs no program values any more, except that they must still agree.
  Config alone = parse_config(once, "again.json");
  ResolveInputs world;
  world.world_size = 16;
  EXPECT_NO_THROW(resolve(alone, world));
  EXPECT_EQ(to_json(alone), once);
}

// The DeepSpeed JSON reader: every section, the number and boolean rules, comments and trailing commas,
// duplicates, unknown keys and their suggestions, error messages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "zero3/config.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

Config parse(const std::string& text) { return parse_config(text, "test.json"); }

// Parses `text` expecting a ConfigError whose message contains every one of `parts`; returns the message.
std::string error_of(const std::string& text, const std::vector<std::string>& parts) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
    return m;
  }
  ADD_FAILURE() << "no ConfigError for: " << text;
  return "";
}

bool has_warning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings) {
    if (w.find(part) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST(ConfigReader, SeedLlamaConfig) {
  // The seed's config (configs/llama-3-8b-stage3.json), verbatim.
  Config c = parse(R"({
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
})");
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.compute_dtype(), DType::bf16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::cpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::cpu);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_FALSE(c.zero.reduce_bucket_size.has_value());
  EXPECT_FALSE(c.zero.prefetch_bucket_size.has_value());
  EXPECT_FALSE(c.zero.param_persistence_threshold.has_value());
  EXPECT_EQ(c.zero.max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.zero.max_reuse_distance, 1'000'000'000);
  EXPECT_FALSE(c.gradient_clipping.has_value());
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_EQ(c.auto_keys, (std::vector<std::string>{"train_batch_size", "train_micro_batch_size_per_gpu",
                                                   "gradient_accumulation_steps", "gradient_clipping",
                                                   "zero_optimization.reduce_bucket_size",
                                                   "zero_optimization.stage3_prefetch_bucket_size",
                                                   "zero_optimization.stage3_param_persistence_threshold"}))
      << "in table order";
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_FALSE(c.resolved);
  EXPECT_EQ(c.source, "test.json");
}

TEST(ConfigReader, DefaultsOfAnEmptyConfig) {
  Config c = parse("{}");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm) << "DeepSpeed: false below stage 3";
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_FALSE(c.zero.offload_param.pin_memory) << "DeepSpeed 0.18's default";
  EXPECT_EQ(c.gradient_clipping, 0.0) << "DeepSpeed 0.18's default";
  EXPECT_FALSE(c.optimizer.present);
  EXPECT_EQ(c.scheduler.type, SchedulerType::none);
  EXPECT_EQ(c.compute_dtype(), DType::f32);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(c.auto_keys.empty());
}

TEST(ConfigReader, OverlapCommDefaultsToTrueAtStage3) {
  EXPECT_TRUE(parse(R"({"zero_optimization": {"stage": 3}})").zero.overlap_comm);
  EXPECT_FALSE(parse(R"({"zero_optimization": {"stage": 2}})").zero.overlap_comm);
  Config c = parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})");
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.overlap_comm_set);
}

TEST(ConfigReader, ZeroSectionEveryKey) {
  Config c = parse(R"({"zero_optimization": {
    "stage": 3, "contiguous_gradients": false, "reduce_scatter": false, "reduce_bucket_size": 123,
    "allgather_partitions": false, "allgather_bucket_size": 456, "overlap_comm": false,
    "load_from_fp32_weights": false, "sub_group_size": 789, "stage3_prefetch_bucket_size": 11,
    "stage3_param_persistence_threshold": 12, "stage3_model_persistence_threshold": 13,
    "stage3_max_live_parameters": 14, "stage3_max_reuse_distance": 15,
    "stage3_gather_16bit_weights_on_model_save": true, "ignore_unused_parameters": false,
    "round_robin_gradients": true,
    "offload_param": {"device": "nvme", "nvme_path": "/tmp/p", "pin_memory": true, "buffer_count": 6,
                      "buffer_size": 1e7, "max_in_cpu": 2e9},
    "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/o", "pin_memory": true, "buffer_count": 8,
                          "pipeline_read": true, "pipeline_write": true, "fast_init": true, "ratio": 0.25}
  }})");
  const ZeroConfig& z = c.zero;
  EXPECT_EQ(z.stage, 3);
  EXPECT_FALSE(z.contiguous_gradients);
  EXPECT_FALSE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 123);
  EXPECT_FALSE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 456);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_FALSE(z.load_from_fp32_weights);
  EXPECT_EQ(z.sub_group_size, 789);
  EXPECT_EQ(z.prefetch_bucket_size, 11);
  EXPECT_EQ(z.param_persistence_threshold, 12);
  EXPECT_EQ(z.model_persistence_threshold, 13);
  EXPECT_EQ(z.max_live_parameters, 14);
  EXPECT_EQ(z.max_reuse_distance, 15);
  EXPECT_TRUE(z.gather_16bit_weights_on_model_save);
  EXPECT_FALSE(z.ignore_unused_parameters);
  EXPECT_TRUE(z.round_robin_gradients);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::nvme);
  EXPECT_EQ(z.offload_param.nvme_path, "/tmp/p");
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 6);
  EXPECT_EQ(z.offload_param.buffer_size, 10'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 2'000'000'000);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::nvme);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/tmp/o");
  EXPECT_EQ(z.offload_optimizer.buffer_count, 8);
  EXPECT_TRUE(z.offload_optimizer.pipeline_read);
  EXPECT_TRUE(z.offload_optimizer.pipeline_write);
  EXPECT_TRUE(z.offload_optimizer.fast_init);
  EXPECT_DOUBLE_EQ(z.offload_optimizer.ratio, 0.25);
}

TEST(ConfigReader, PrecisionSections) {
  Config c = parse(R"({"fp16": {"enabled": true, "auto_cast": false, "loss_scale": 128, "initial_scale_power": 12,
    "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.5}})");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 128);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 0.5);
  EXPECT_EQ(c.compute_dtype(), DType::f16);

  c = parse(R"({"bf16": {"enabled": true, "immediate_grad_update": true, "check_grad_overflow": true}})");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(c.bf16.immediate_grad_update);
  EXPECT_TRUE(c.bf16.check_grad_overflow);

  c = parse(R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}})");
  EXPECT_TRUE(c.bf16.auto_enabled);
  EXPECT_TRUE(c.fp16.auto_enabled);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
}

TEST(ConfigReader, AioSection) {
  Config c = parse(R"({"aio": {"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 4,
                              "single_submit": true, "overlap_events": false}})");
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
}

TEST(ConfigReader, OptimizerSection) {
  Config c = parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.8, 0.95], "eps": 1e-6,
                      "weight_decay": 3e-7, "bias_correction": false}}})");
  EXPECT_TRUE(c.optimizer.present);
  EXPECT_EQ(c.optimizer.type, OptimizerType::adamw);
  EXPECT_EQ(c.optimizer.lr, 0.001);
  EXPECT_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 3e-7);
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_TRUE(c.optimizer.adam_w_mode);

  // DeepSpeed: "Adam" is AdamW unless adam_w_mode is false. Names are case-insensitive.
  c = parse(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::adam);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  c = parse(R"({"optimizer": {"type": "ADAM"}})");
  EXPECT_EQ(c.optimizer.type, OptimizerType::adam);
  EXPECT_TRUE(c.optimizer.adam_w_mode);

  // AdamW with adam_w_mode false is still AdamW, with a warning.
  c = parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(has_warning(c, "optimizer.params.adam_w_mode"));

  c = parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                          "weight_decay": "auto"}}})");
  EXPECT_FALSE(c.optimizer.lr.has_value());
  EXPECT_FALSE(c.optimizer.weight_decay.has_value());
  EXPECT_EQ(c.auto_keys.size(), 4u);
}

TEST(ConfigReader, OptimizerErrors) {
  for (const char* name :
       {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion", "Muon", "MuAdam", "MuAdamW", "MuSGD"}) {
    error_of(std::string(R"({"optimizer": {"type": ")") + name + "\"}}",
             {"optimizer.type", std::string("\"") + name + "\" is not supported", "Adam", "AdamW"});
  }
  error_of(R"({"optimizer": {"type": "SGD"}})", {"optimizer.type", "\"SGD\" is not supported", "torch"});
  error_of(R"({"optimizer": {"params": {"lr": 1}}})", {"optimizer.type", "missing", "\"AdamW\""});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
           {"optimizer.params.betas", "got [0.9]", "two numbers"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}})",
           {"optimizer.params.betas", "[0, 1)"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})", {"optimizer.params.lr", "got -1", ">= 0"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
           {"optimizer.params.max_grad_norm", "gradient_clipping"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})",
           {"optimizer.params.amsgrad", "got true", "not supported", "AMSGrad"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})",
           {"optimizer.params.momentum", "unknown key in optimizer.params"});
}

TEST(ConfigReader, SchedulerTypes) {
  Config c = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.01,
                      "warmup_num_steps": 50, "warmup_type": "linear"}}})");
  EXPECT_EQ(c.scheduler.type, SchedulerType::warmup_lr);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0001);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.01);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 50);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");

  c = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 10}}})");
  EXPECT_EQ(c.scheduler.type, SchedulerType::warmup_decay_lr);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.001) << "WarmupDecayLR's own default";

  c = parse(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 500, "warmup_min_ratio": 0.1,
                "cos_min_ratio": 0.01, "warmup_num_steps": 20}}})");
  EXPECT_EQ(c.scheduler.type, SchedulerType::warmup_cosine_lr);
  EXPECT_EQ(c.scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 0.01);

  c = parse(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                "decay_lr_rate": 0.1, "cycle_first_step_size": 100, "cycle_second_step_size": 200,
                "cycle_first_stair_count": 3, "decay_step_size": 10, "cycle_momentum": false,
                "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}}})");
  const SchedulerConfig& s = c.scheduler;
  EXPECT_EQ(s.type, SchedulerType::one_cycle);
  EXPECT_EQ(s.cycle_min_lr, 1e-4);
  EXPECT_EQ(s.cycle_max_lr, 1e-3);
  EXPECT_EQ(s.decay_lr_rate, 0.1);
  EXPECT_EQ(s.cycle_first_step_size, 100);
  EXPECT_EQ(s.cycle_second_step_size, 200);
  EXPECT_EQ(s.cycle_first_stair_count, 3);
  EXPECT_EQ(s.cycle_second_stair_count, 3) << "DeepSpeed: defaults to cycle_first_stair_count";
  EXPECT_EQ(s.decay_step_size, 10);
  EXPECT_FALSE(s.cycle_momentum);
  EXPECT_EQ(s.cycle_min_mom, 0.85);
  EXPECT_EQ(s.cycle_max_mom, 0.95);
  EXPECT_EQ(s.decay_mom_rate, 0.01);
}

TEST(ConfigReader, WarmupLrWithoutMaxFollowsTheOptimizer) {
  Config c = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  EXPECT_FALSE(c.scheduler.warmup_max_lr.has_value());
  EXPECT_NE(std::find(c.auto_keys.begin(), c.auto_keys.end(), "scheduler.params.warmup_max_lr"), c.auto_keys.end());
}

TEST(ConfigReader, SchedulerErrors) {
  error_of(R"({"scheduler": {"type": "LRRangeTest"}})", {"scheduler.type", "\"LRRangeTest\" is not supported"});
  error_of(R"({"scheduler": {"type": "warmuplr"}})", {"scheduler.type", "got \"warmuplr\"", "\"WarmupLR\""});
  error_of(R"({"scheduler": {"params": {}}})", {"scheduler.type", "missing"});
  error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"cycle_min_lr": 0.1}}})",
           {"scheduler.params.cycle_min_lr", "not a parameter of WarmupLR", "OneCycle"});
  error_of(
      R"({"scheduler": {"type": "OneCycle", "params": {"warmup_num_steps": 10, "cycle_min_lr": 0, "cycle_max_lr": 1}}})",
      {"scheduler.params.warmup_num_steps", "not a parameter of OneCycle"});
  error_of(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
           {"scheduler.params.total_num_steps", "missing", "WarmupDecayLR"});
  error_of(R"({"scheduler": {"type": "WarmupCosineLR"}})", {"scheduler.params.total_num_steps", "missing"});
  error_of(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 1}}})",
           {"scheduler.params.cycle_min_lr", "missing"});
  error_of(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1}}})",
           {"scheduler.params.cycle_max_lr", "missing"});
  error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
           {"scheduler.params.warmup_type", "got \"cosine\"", "\"log\" or \"linear\""});
  error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}}})",
           {"scheduler.params.last_batch_iteration", "got 5", "not supported"});
  error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
           {"scheduler.params.warmup_num_steps", "got 0", ">= 1"});
}

TEST(ConfigReader, TopLevelKeys) {
  Config c = parse(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5, "prescale_gradients": true, "gradient_predivide_factor": 2.0,
    "communication_data_type": "bf16", "steps_per_print": 5, "wall_clock_breakdown": true, "dump_state": true,
    "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_TRUE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 2.0);
  EXPECT_EQ(c.communication_data_type, DType::bf16);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.dump_state);
  EXPECT_EQ(c.grad_accum_dtype, DType::f32);
  // DeepSpeed's other spellings of the data types.
  EXPECT_EQ(parse(R"({"communication_data_type": "float16"})").communication_data_type, DType::f16);
  EXPECT_EQ(parse(R"({"communication_data_type": "FP32"})").communication_data_type, DType::f32);
  EXPECT_EQ(parse(R"({"data_types": {"grad_accum_dtype": "torch.bfloat16"}})").grad_accum_dtype, DType::bf16);
  error_of(R"({"communication_data_type": "int8"})", {"communication_data_type", "got \"int8\"", "\"fp32\""});
  error_of(R"({"gradient_predivide_factor": 0})", {"gradient_predivide_factor", "got 0", "> 0"});
  error_of(R"({"gradient_clipping": -1.0})", {"gradient_clipping", "got -1.0", ">= 0"});
  error_of(R"({"gradient_allreduce_op": "sum"})", {"gradient_allreduce_op", "got \"sum\"", "not supported"});
  EXPECT_TRUE(parse(R"({"gradient_allreduce_op": "mean"})").warnings.empty());
}

TEST(ConfigReader, CheckpointAndMonitors) {
  Config c = parse(R"({"checkpoint": {"tag_validation": "fail", "use_node_local_storage": true},
    "tensorboard": {"enabled": true, "output_path": "/tmp/tb", "job_name": "run1"},
    "csv_monitor": {"enabled": true, "output_path": "/tmp/csv", "job_name": "run2"}})");
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail") << "any case, stored in DeepSpeed's spelling";
  EXPECT_TRUE(c.checkpoint.use_node_local_storage);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "/tmp/tb");
  EXPECT_EQ(c.tensorboard.job_name, "run1");
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "/tmp/csv");
  EXPECT_EQ(c.csv_monitor.job_name, "run2");
  error_of(R"({"checkpoint": {"tag_validation": "Strict"}})",
           {"checkpoint.tag_validation", "got \"Strict\"", "\"Ignore\", \"Warn\" or \"Fail\""});
  error_of(R"({"checkpoint": {"load_universal": true}})", {"checkpoint.load_universal", "not supported"});
  // wandb and comet: accepted, a warning when enabled.
  c = parse(R"({"wandb": {"enabled": true, "project": "x"}, "comet": {"enabled": false}})");
  EXPECT_TRUE(has_warning(c, "wandb: ignored"));
  EXPECT_FALSE(has_warning(c, "comet"));
}

TEST(ConfigReader, Zero3Section) {
  Config c = parse(R"({"zero3": {"device": "cuda", "comm_backend": "nccl", "network": "efa", "comm_timeout_s": 30,
                               "seed": 42, "check_schedule_every_step": true, "nccl_register_buffers": true}})");
  EXPECT_EQ(c.zero3.device, "cuda");
  EXPECT_EQ(c.zero3.comm_backend, "nccl");
  EXPECT_EQ(c.zero3.network, NetworkTransport::efa);
  EXPECT_EQ(c.zero3.comm_timeout_s, 30);
  EXPECT_EQ(c.zero3.seed, 42u);
  EXPECT_TRUE(c.zero3.check_schedule_every_step);
  EXPECT_TRUE(c.zero3.nccl_register_buffers);
  EXPECT_EQ(parse(R"({"zero3": {"network": "socket"}})").zero3.network, NetworkTransport::socket);
  error_of(R"({"zero3": {"device": "gpu"}})", {"zero3.device", "got \"gpu\"", "\"auto\", \"cpu\" or \"cuda\""});
  error_of(R"({"zero3": {"comm_backend": "mpi"}})", {"zero3.comm_backend", "got \"mpi\""});
  error_of(R"({"zero3": {"network": "ib"}})", {"zero3.network", "got \"ib\""});
  error_of(R"({"zero3": {"comm_timeout_s": 0}})", {"zero3.comm_timeout_s", "got 0", ">= 1"});
  error_of(R"({"zero3": {"comm_backend": "nccl", "device": "cpu"}})",
           {"zero3.comm_backend", "got \"nccl\"", "zero3.device \"cpu\"", "CUDA"});
  error_of(R"({"zero3": {"network": "efa", "comm_backend": "gloo"}})",
           {"zero3.network", "got \"efa\"", "\"gloo\"", "NCCL"});
  error_of(R"({"zero3": {"devcie": "cpu"}})", {"zero3.devcie", "did you mean \"device\"?"});
}

TEST(ConfigReader, IntegersWrittenAsFloats) {
  Config c = parse(R"({"zero_optimization": {"stage": 3.0, "sub_group_size": 1e9, "reduce_bucket_size": 5e8,
                      "stage3_max_live_parameters": 1.5e9}})");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero.max_live_parameters, 1'500'000'000);
  // int(0.9 * 4096^2) pasted without the int(): an error that names the key and shows the value.
  std::string m = error_of(
      R"({"zero_optimization": {"stage3_prefetch_bucket_size": 15099494.4}})",
      {"zero_optimization.stage3_prefetch_bucket_size", "got 15099494.4", "an integer", "fraction", "(in test.json)"});
  EXPECT_EQ(m.rfind("zero_optimization.stage3_prefetch_bucket_size: ", 0), 0u) << "starts with the key path";
  error_of(R"({"train_micro_batch_size_per_gpu": 2.5})", {"train_micro_batch_size_per_gpu", "got 2.5"});
  error_of(R"({"zero_optimization": {"sub_group_size": 1e19}})", {"zero_optimization.sub_group_size", "got 1e+19"});
  error_of(R"({"zero_optimization": {"sub_group_size": 18446744073709551615}})",
           {"zero_optimization.sub_group_size", "got 18446744073709551615"});
  error_of(R"({"zero_optimization": {"stage": "3"}})", {"zero_optimization.stage", "got \"3\"", "an integer"});
}

TEST(ConfigReader, NegativeSizes) {
  error_of(R"({"zero_optimization": {"reduce_bucket_size": -1}})",
           {"zero_optimization.reduce_bucket_size", "got -1", ">= 0"});
  error_of(R"({"zero_optimization": {"stage3_max_live_parameters": -5}})",
           {"zero_optimization.stage3_max_live_parameters", "got -5", ">= 0"});
  error_of(R"({"zero_optimization": {"offload_param": {"buffer_size": -1}}})",
           {"zero_optimization.offload_param.buffer_size", "got -1"});
  error_of(R"({"aio": {"block_size": 0}})", {"aio.block_size", "got 0", ">= 1"});
  error_of(R"({"train_batch_size": -8})", {"train_batch_size", "got -8", ">= 1"});
  error_of(R"({"fp16": {"loss_scale": -1}})", {"fp16.loss_scale", "got -1"});
  error_of(R"({"fp16": {"min_loss_scale": 0}})", {"fp16.min_loss_scale", "got 0", "> 0"});
  error_of(R"({"fp16": {"loss_scale_window": 0}})", {"fp16.loss_scale_window", "got 0", ">= 1"});
  error_of(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}})",
           {"zero_optimization.offload_optimizer.ratio", "got 1.5", "from 0"});
}

TEST(ConfigReader, BooleansAreStrict) {
  error_of(R"({"zero_optimization": {"overlap_comm": 1}})",
           {"zero_optimization.overlap_comm", "got 1", "true or false"});
  error_of(R"({"zero_optimization": {"overlap_comm": "true"}})",
           {"zero_optimization.overlap_comm", "got \"true\"", "true or false"});
  error_of(R"({"bf16": {"enabled": "yes"}})", {"bf16.enabled", "got \"yes\""});
  error_of(R"({"wall_clock_breakdown": 0})", {"wall_clock_breakdown", "got 0"});
}

TEST(ConfigReader, StageOutsideZeroToThree) {
  error_of(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "got 4", "from 0 to 3"});
  error_of(R"({"zero_optimization": {"stage": -1}})", {"zero_optimization.stage", "got -1", "from 0 to 3"});
}

TEST(ConfigReader, OffloadValues) {
  error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})",
           {"zero_optimization.offload_param.device", "got \"gpu\"", "\"none\", \"cpu\" or \"nvme\""});
  error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"ratio": 0.5}}})",
           {"zero_optimization.offload_param.ratio", "belongs in zero_optimization.offload_optimizer"});
  error_of(R"({"zero_optimization": {"stage": 3, "offload_param": "cpu"}})",
           {"zero_optimization.offload_param", "got \"cpu\"", "an object"});
  error_of(R"({"zero_optimization": {"offload_optimizer": {"nvme_path": 5}}})",
           {"zero_optimization.offload_optimizer.nvme_path", "got 5", "a string"});
}

TEST(ConfigReader, CrossFieldChecks) {
  error_of(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
           {"zero_optimization.offload_optimizer.device", "stage 0", "stage 1, 2 or 3"});
  error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
           {"zero_optimization.offload_optimizer.ratio", "got 0.5", "stage 3"});
  error_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
           {"bf16.enabled", "got true", "fp16.enabled true", "at most one"});
  // Offload with device "none" is no offload, at any stage.
  EXPECT_NO_THROW(parse(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "none"}}})"));
  EXPECT_NO_THROW(parse(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})"));
}

TEST(ConfigReader, CommentsAndTrailingCommas) {
  Config c = parse(R"(
// a line comment
# a hash comment, as hjson allows
{
  /* a block
     comment over lines */
  "zero_optimization": {
    "stage": 3,  // after a value
    "offload_param": {"device": "nvme", "nvme_path": "/tmp/a#b//c/*d*/",},  # hash after a value
  },
  "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.95,],},},
}
)");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/tmp/a#b//c/*d*/") << "comment markers inside strings are text";
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  // Escaped quotes do not end a string.
  c = parse(R"({"tensorboard": {"job_name": "a\"b // c, }"}})");
  EXPECT_EQ(c.tensorboard.job_name, "a\"b // c, }");
}

TEST(ConfigReader, SyntaxErrorsKeepLineNumbers) {
  // Comments are blanked, not removed, so the line and column point into the original text.
  error_of("// one\n/* two\nthree */\n{\n  \"stage\": 3 \"x\": 1\n}", {"test.json:5:16", "JSON syntax error"});
  error_of("{\"a\": 1 /* never closed", {"test.json:1:9", "never closed"});
  error_of("{\"zero_optimization\": {\"stage\": 3,, }}", {"test.json:1:", "JSON syntax error"});
  error_of("[1, 2]", {"test.json", "must be a JSON object"});
  error_of("", {"test.json: no JSON in it"});
  error_of("  // only a comment\n", {"test.json: no JSON in it"});
}

TEST(ConfigReader, DuplicateKeys) {
  error_of(R"({"steps_per_print": 1, "steps_per_print": 2})", {"steps_per_print", "given twice"});
  error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "device": "nvme"}}})",
           {"zero_optimization.offload_param.device", "given twice"});
  error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1, "lr": 2}}})", {"optimizer.params.lr", "given twice"});
  // Equal keys in different objects are not duplicates.
  EXPECT_NO_THROW(parse(R"({"fp16": {"enabled": false}, "bf16": {"enabled": true}})"));
  EXPECT_NO_THROW(parse(R"({"x": [{"a": 1}, {"a": 2}]})"));
}

TEST(ConfigReader, UnknownKeysInsideSectionsAreErrors) {
  error_of(R"({"zero_optimization": {"stage3_prefetch_bucket": 5}})",
           {"zero_optimization.stage3_prefetch_bucket", "unknown key in zero_optimization",
            "did you mean \"stage3_prefetch_bucket_size\"?"});
  error_of(R"({"zero_optimization": {"overlapcomm": true}})", {"did you mean \"overlap_comm\"?"});
  error_of(R"({"zero_optimization": {"Stage": 3}})", {"did you mean \"stage\"?"});
  error_of(R"({"bf16": {"enable": true}})", {"bf16.enable", "did you mean \"enabled\"?"});
  error_of(R"({"aio": {"queue_deph": 8}})", {"aio.queue_deph", "did you mean \"queue_depth\"?"});
  // A key of another section says where it belongs.
  error_of(R"({"zero_optimization": {"train_batch_size": 8}})",
           {"zero_optimization.train_batch_size", "belongs in the top level"});
  // Nothing close: the known keys are listed.
  error_of(R"({"csv_monitor": {"xyzzy": 1}})", {"csv_monitor.xyzzy", "known keys: enabled, output_path, job_name"});
}

TEST(ConfigReader, UnknownTopLevelKeysWarnOnce) {
  Config c = parse(R"({"zero_optimisation": {"stage": 3}, "my_own_key": 1, "steps_per_print": 3})");
  ASSERT_EQ(c.warnings.size(), 1u);
  const std::string& w = c.warnings[0];
  EXPECT_NE(w.find("unknown top-level keys"), std::string::npos) << w;
  EXPECT_NE(w.find("\"my_own_key\""), std::string::npos) << w;
  EXPECT_NE(w.find("\"zero_optimisation\" (did you mean \"zero_optimization\"?)"), std::string::npos) << w;
  EXPECT_EQ(c.zero.stage, 0) << "the misspelt section is ignored, as DeepSpeed does";
  EXPECT_EQ(c.steps_per_print, 3);
}

TEST(ConfigReader, NullMeansNotGiven) {
  Config c = parse(R"({"communication_data_type": null, "zero_optimization": {"offload_param": null, "stage": 3,
                      "reduce_bucket_size": null}, "scheduler": null})");
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::none);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.scheduler.type, SchedulerType::none);
}

TEST(ConfigReader, AutoOnlyWhereHuggingFaceFillsIt) {
  error_of(R"({"zero_optimization": {"stage": "auto"}})",
           {"zero_optimization.stage", "got \"auto\"", "only where Hugging Face fills it in"});
  error_of(R"({"steps_per_print": "auto"})", {"steps_per_print", "got \"auto\""});
  error_of(R"({"fp16": "auto"})", {"fp16", "got \"auto\"", "an object"});
}

TEST(ConfigReader, IgnoredAndRefusedSections) {
  Config c = parse(R"({"flops_profiler": {"enabled": true, "profile_step": 1}, "activation_checkpointing":
    {"partition_activations": false}, "amp": {"enabled": false}, "elasticity": {"enabled": false},
    "tensor_parallel": {"autotp_size": 1}, "comms_logger": {"enabled": false}})");
  EXPECT_TRUE(has_warning(c, "flops_profiler: ignored"));
  EXPECT_TRUE(has_warning(c, "activation_checkpointing: ignored"));
  EXPECT_FALSE(has_warning(c, "amp:"));
  EXPECT_FALSE(has_warning(c, "comms_logger"));
  error_of(R"({"amp": {"enabled": true, "opt_level": "O2"}})", {"amp", "not supported", "Apex"});
  error_of(R"({"tensor_parallel": {"autotp_size": 4}})", {"tensor_parallel", "not supported", "Tensor parallelism"});
  error_of(R"({"sparse_attention": {"mode": "fixed"}})", {"sparse_attention", "not supported"});
  error_of(R"({"data_efficiency": {"enabled": true}})", {"data_efficiency", "not supported"});
  error_of(R"({"compression_training": {"weight_quantization": {}}})", {"compression_training", "not supported"});
  error_of(R"({"zero_optimization": {"zero_quantized_weights": true}})",
           {"zero_optimization.zero_quantized_weights", "got true with zero_optimization.stage 0", "stage 3"});
  error_of(R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})",
           {"zero_optimization.zero_quantized_gradients", "got true with zero_optimization.stage 2", "stage 3"});
  // hpZ and MiCS lay out stage 3's partitions: below it they are errors.
  error_of(R"({"zero_optimization": {"zero_hpz_partition_size": 8}})",
           {"zero_optimization.zero_hpz_partition_size", "got 8 with zero_optimization.stage 0", "stage 3"});
  error_of(R"({"zero_optimization": {"mics_shard_size": 8}})",
           {"zero_optimization.mics_shard_size", "got 8 with zero_optimization.stage 0", "stage 3"});
  // Their "off" values pass silently.
  c = parse(R"({"zero_optimization": {"zero_quantized_weights": false, "zero_hpz_partition_size": 1,
                "mics_shard_size": -1, "zero_quantized_gradients": false}})");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ConfigReader, LayoutKeys) {
  Config c = parse(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})");
  EXPECT_EQ(c.zero.hpz_partition_size, 8);
  EXPECT_EQ(c.zero.mics_shard_size, -1);
  c = parse(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 4, "mics_hierarchical_params_gather": true}})");
  EXPECT_EQ(c.zero.mics_shard_size, 4);
  EXPECT_TRUE(c.zero.mics_hierarchical_params_gather);
  EXPECT_TRUE(c.warnings.empty());
  error_of(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4, "mics_shard_size": 4}})",
           {"zero_optimization.zero_hpz_partition_size", "with zero_optimization.mics_shard_size 4", "one of the two"});
  error_of(R"({"zero_optimization": {"stage": 3, "mics_hierarchical_params_gather": true}})",
           {"zero_optimization.mics_hierarchical_params_gather", "positive mics_shard_size"});
  error_of(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": -2}})",
           {"zero_optimization.zero_hpz_partition_size"});
  // ZeRO++'s quantized collectives: stage 3, 16-bit compute, block sizes positive (and even for qgZ's int4).
  c = parse(R"({"bf16": {"enabled": true}, "zero3": {"qwz_block_size": 512, "qgz_block_size": 64},
                "zero_optimization": {"stage": 3, "zero_quantized_weights": true, "zero_quantized_gradients": true}})");
  EXPECT_TRUE(c.zero.quantized_weights);
  EXPECT_TRUE(c.zero.quantized_gradients);
  EXPECT_EQ(c.zero3.qwz_block_size, 512);
  EXPECT_EQ(c.zero3.qgz_block_size, 64);
  error_of(R"({"zero3": {"qwz_block_size": 0}, "zero_optimization": {"stage": 3, "zero_quantized_weights": true}})",
           {"zero3.qwz_block_size"});
  error_of(R"({"zero3": {"qgz_block_size": -4}})", {"zero3.qgz_block_size"});
  error_of(R"({"zero3": {"qgz_block_size": 99}, "zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})",
           {"zero3.qgz_block_size", "got 99", "even number", "two per byte"});
  ResolveInputs fp32;
  fp32.precision = DType::f32;
  Config q = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": true}})");
  try {
    resolve(q, fp32);
    FAIL() << "qwZ with fp32 compute was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.zero_quantized_weights: got true with fp32 compute"),
              std::string::npos)
        << e.what();
  }
  // The world must be tiled by the groups (resolve knows the world size; the engine checks the nodes too).
  ResolveInputs six;
  six.world_size = 6;
  Config r = parse(R"({"train_batch_size": 6, "zero_optimization": {"stage": 3, "mics_shard_size": 4}})");
  try {
    resolve(r, six);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.mics_shard_size: got 4 with a world size of 6"),
              std::string::npos)
        << e.what();
  }
  Config h = parse(R"({"train_batch_size": 4, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})");
  ResolveInputs four;
  four.world_size = 4;
  resolve(h, four);  // hpZ over more than the world: no effect, as DeepSpeed's min()
}

TEST(ConfigReader, LoadConfigReadsFiles) {
  std::string path = testing::TempDir() + "zero3_config_reader.json";
  {
    std::ofstream out(path);
    out << "{\"zero_optimization\": {\"stage\": 2}}\n";
  }
  Config c = load_config(path);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.source, path);
  std::remove(path.c_str());
  try {
    load_config("/nonexistent/ds_config.json");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/ds_config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("cannot open"), std::string::npos) << m;
  }
}

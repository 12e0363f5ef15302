// resolve(): "auto" the way Hugging Face's DeepSpeed integration fills it in, DeepSpeed's batch-size
// inference, and the checks that need the program's facts.
#include <algorithm>
#include <string>
#include <vector>

#include "config/config_checks.hpp"
#include "config/config_value.hpp"
#include "core/env.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/pipeline_schedule.hpp"

namespace zero3 {
namespace {

using config_detail::error_text;

class Resolver {
 public:
  Resolver(Config& c, const ResolveInputs& in) : c_(c), in_(in) {}

  void run() {
    world_ = in_.world_size.value_or(1);
    if (world_ < 1) {
      throw ConfigError("world size: got " + std::to_string(world_) + ", expected an integer >= 1");
    }
    precision();
    gradient_clipping();
    hidden_size_keys();
    save_16bit_model();
    optimizer();
    scheduler();
    pipeline_stages();
    batch();
    pipeline_schedule();
    nvme_paths();
    layout_groups();
    config_detail::check_static(c_);
    if (in_.precision || c_.bf16.section_given || c_.fp16.section_given) {
      config_detail::check_quantization_precision(c_);
    }
    c_.resolved = true;
    for (const std::string& n : notes_) log::info_rank0(c_.source, ": ", n);
  }

 private:
  bool was_auto(std::string_view path) const {
    return std::find(c_.auto_keys.begin(), c_.auto_keys.end(), path) != c_.auto_keys.end();
  }

  [[noreturn]] void fail(std::string_view path, const std::string& message) const {
    throw ConfigError(error_text(path, message, c_.source));
  }

  void note(std::string_view path, const std::string& value, const std::string& why) {
    notes_.push_back(std::string(path) + ": \"auto\" -> " + value + " (" + why + ")");
  }

  // ----- MiCS and hpZ groups: they must tile the ranks ZeRO runs over (the engine also checks them against the
  // nodes): the world, or with pipeline stages each stage's data-parallel ranks -----
  void layout_groups() {
    const ZeroConfig& z = c_.zero;
    if (z.stage != 3) return;  // check_static refuses them below stage 3
    const int64_t stages = c_.pipeline.stages.value_or(1);
    const bool staged = stages > 1 && world_ % stages == 0;
    const int64_t ranks = staged ? world_ / stages : world_;
    const std::string size = staged ? "data-parallel size" : "world size";
    const std::string of = staged ? std::to_string(ranks) + " (world size " + std::to_string(world_) +
                                        " / pipeline.stages " + std::to_string(stages) + ")"
                                  : std::to_string(world_);
    auto check = [&](const char* path, int64_t n) {
      if (n > ranks || ranks % n != 0) {
        fail(path, "got " + std::to_string(n) + " with a " + size + " of " + of + ", expected a divisor of the " +
                       size + ": the groups of consecutive ranks must tile " +
                       (staged ? "each stage's data-parallel ranks" : "the world"));
      }
    };
    if (z.mics_shard_size > 0) check("zero_optimization.mics_shard_size", z.mics_shard_size);
    // hpZ over the whole group or more has no effect (DeepSpeed takes the minimum).
    if (z.hpz_partition_size > 1 && z.hpz_partition_size < ranks) {
      check("zero_optimization.zero_hpz_partition_size", z.hpz_partition_size);
    }
  }

  // ----- bf16 / fp16 -----
  void precision() {
    if (c_.bf16.auto_enabled || c_.fp16.auto_enabled) {
      const char* path = c_.bf16.auto_enabled ? "bf16.enabled" : "fp16.enabled";
      if (!in_.precision) {
        fail(path,
             "\"auto\" needs the program's precision: pass --precision bf16|fp16|fp32 to `zero3 config check` "
             "(ResolveInputs::precision in a program)");
      }
      if (c_.bf16.auto_enabled) {
        c_.bf16.enabled = *in_.precision == DType::bf16;
        note("bf16.enabled", c_.bf16.enabled ? "true" : "false", "the program's precision");
      }
      if (c_.fp16.auto_enabled) {
        c_.fp16.enabled = *in_.precision == DType::f16;
        note("fp16.enabled", c_.fp16.enabled ? "true" : "false", "the program's precision");
      }
    }
    if (!in_.precision) return;
    DType want = *in_.precision;
    // Accelerate's set_mixed_precision: a bf16 (fp16) program whose config has no bf16 (fp16) section gets
    // one with "enabled": true. An explicit section keeps its value (a mismatch is refused below).
    if (!c_.bf16.enabled && !c_.fp16.enabled) {
      if (want == DType::bf16 && !c_.bf16.section_given) {
        c_.bf16.enabled = true;
        notes_.push_back("bf16.enabled: no bf16 section -> true (the program's precision, as Accelerate fills it)");
      } else if (want == DType::f16 && !c_.fp16.section_given) {
        c_.fp16.enabled = true;
        notes_.push_back("fp16.enabled: no fp16 section -> true (the program's precision, as Accelerate fills it)");
      }
    }
    DType have = c_.compute_dtype();
    if (want == have || (c_.fp16.enabled && c_.bf16.enabled)) return;  // both enabled: check_static says so
    std::string want_name = want == DType::bf16 ? "bf16" : want == DType::f16 ? "fp16" : "fp32";
    if (have == DType::bf16) {
      fail("bf16.enabled", "got true, but the program runs in " + want_name +
                               " (--precision); expected false, or \"auto\" to follow the program");
    }
    if (have == DType::f16) {
      fail("fp16.enabled", "got true, but the program runs in " + want_name +
                               " (--precision); expected false, or \"auto\" to follow the program");
    }
    const char* path = want == DType::bf16 ? "bf16.enabled" : "fp16.enabled";
    fail(path, "is not true, so the config selects fp32, but the program runs in " + want_name +
                   " (--precision); expected true, or \"auto\" to follow the program");
  }

  void gradient_clipping() {
    if (c_.gradient_clipping) return;
    c_.gradient_clipping = in_.max_grad_norm.value_or(1.0);
    note("gradient_clipping", config_detail::show(*c_.gradient_clipping),
         in_.max_grad_norm ? "the program's max grad norm" : "Hugging Face's default max_grad_norm");
  }

  // ----- sizes from the model's hidden size (Hugging Face's trainer_config_finalize) -----
  int64_t hidden(std::string_view path) {
    if (!in_.hidden_size) {
      fail(path,
           "\"auto\" needs the model's hidden size: pass --hidden-size N to `zero3 config check` "
           "(ResolveInputs::hidden_size in a program)");
    }
    if (*in_.hidden_size < 1) {
      throw ConfigError("hidden size: got " + std::to_string(*in_.hidden_size) + ", expected an integer >= 1");
    }
    return *in_.hidden_size;
  }

  // An "auto" size computed from the hidden size that does not fit in 64 bits.
  [[noreturn]] void too_large(std::string_view path, const char* rule, int64_t h) const {
    fail(path, "\"auto\" is " + std::string(rule) + ", which for hidden size " + std::to_string(h) +
                   " (--hidden-size) is beyond the largest 64-bit integer, 9223372036854775807; pass the model's "
                   "hidden size, or give the key a number");
  }

  void hidden_size_keys() {
    ZeroConfig& z = c_.zero;
    if (!z.reduce_bucket_size) {
      const char* path = "zero_optimization.reduce_bucket_size";
      int64_t h = hidden(path), h2 = 0;
      if (__builtin_mul_overflow(h, h, &h2)) too_large(path, "hidden_size^2", h);
      z.reduce_bucket_size = h2;
      note(path, std::to_string(*z.reduce_bucket_size), "hidden_size^2");
    }
    if (!z.prefetch_bucket_size) {
      const char* path = "zero_optimization.stage3_prefetch_bucket_size";
      if (z.stage == 3) {
        int64_t h = hidden(path);
        // Python's int(0.9 * h * h): the same double arithmetic, left to right, truncated.
        double v = 0.9 * static_cast<double>(h) * static_cast<double>(h);
        if (!(v < 9223372036854775808.0)) too_large(path, "int(0.9 x hidden_size^2)", h);
        z.prefetch_bucket_size = static_cast<int64_t>(v);
        note(path, std::to_string(*z.prefetch_bucket_size), "int(0.9 x hidden_size^2)");
      } else {
        z.prefetch_bucket_size = 50'000'000;
        note(path, "50000000", "DeepSpeed's default; unused below stage 3");
      }
    }
    if (!z.param_persistence_threshold) {
      const char* path = "zero_optimization.stage3_param_persistence_threshold";
      if (z.stage == 3) {
        int64_t h = hidden(path), t = 0;
        if (__builtin_mul_overflow(int64_t{10}, h, &t)) too_large(path, "10 x hidden_size", h);
        z.param_persistence_threshold = t;
        note(path, std::to_string(*z.param_persistence_threshold), "10 x hidden_size");
      } else {
        z.param_persistence_threshold = 100'000;
        note(path, "100000", "DeepSpeed's default; unused below stage 3");
      }
    }
  }

  // Accelerate fills "auto" from its zero3_save_16bit_model (accelerate config, or
  // ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL), false unless set.
  void save_16bit_model() {
    const char* path = "zero_optimization.stage3_gather_16bit_weights_on_model_save";
    if (!was_auto(path) || c_.resolved) return;
    c_.zero.gather_16bit_weights_on_model_save = in_.save_16bit_model.value_or(false);
    note(
        path, c_.zero.gather_16bit_weights_on_model_save ? "true" : "false",
        in_.save_16bit_model ? "the program's save_16bit_model" : "Accelerate's default, zero3_save_16bit_model false");
  }

  // ----- optimizer and scheduler -----
  void optimizer() {
    OptimizerConfig& o = c_.optimizer;
    if (!o.lr) {
      if (!in_.lr) {
        fail("optimizer.params.lr",
             "\"auto\" needs the learning rate: pass --lr X to `zero3 config check` (ResolveInputs::lr in a "
             "program)");
      }
      o.lr = in_.lr;
      note("optimizer.params.lr", config_detail::show(*o.lr), "the program's learning rate");
    } else if (!o.present && in_.lr) {
      o.lr = in_.lr;  // no optimizer section: the program's own hyper-parameters
    }
    if (!o.weight_decay) {
      o.weight_decay = in_.weight_decay.value_or(0.0);
      note("optimizer.params.weight_decay", config_detail::show(*o.weight_decay),
           in_.weight_decay ? "the program's weight decay" : "Hugging Face's default");
    }
    if (was_auto("optimizer.params.betas") && !c_.resolved) {
      if (in_.adam_beta1) o.beta1 = *in_.adam_beta1;
      if (in_.adam_beta2) o.beta2 = *in_.adam_beta2;
      note("optimizer.params.betas", "[" + config_detail::show(o.beta1) + ", " + config_detail::show(o.beta2) + "]",
           in_.adam_beta1 || in_.adam_beta2 ? "the program's betas" : "Hugging Face's defaults");
    }
    if (was_auto("optimizer.params.eps") && !c_.resolved) {
      if (in_.adam_epsilon) o.eps = *in_.adam_epsilon;
      note("optimizer.params.eps", config_detail::show(o.eps),
           in_.adam_epsilon ? "the program's epsilon" : "Hugging Face's default");
    }
  }

  void scheduler() {
    SchedulerConfig& s = c_.scheduler;
    const bool warmup_lr = s.type == SchedulerType::warmup_lr || s.type == SchedulerType::warmup_decay_lr;
    const bool warmup = warmup_lr || s.type == SchedulerType::warmup_cosine_lr;
    const bool total = s.type == SchedulerType::warmup_decay_lr || s.type == SchedulerType::warmup_cosine_lr;
    if (warmup_lr && !s.warmup_max_lr) {
      s.warmup_max_lr = in_.lr ? *in_.lr : *c_.optimizer.lr;
      note("scheduler.params.warmup_max_lr", config_detail::show(*s.warmup_max_lr),
           in_.lr ? "the program's learning rate" : "optimizer.params.lr");
    }
    if (warmup && !s.warmup_num_steps) {
      if (!in_.warmup_steps) {
        fail("scheduler.params.warmup_num_steps",
             "\"auto\" needs the number of warmup steps: pass --warmup-steps N to `zero3 config check` "
             "(ResolveInputs::warmup_steps in a program)");
      }
      s.warmup_num_steps = in_.warmup_steps;
      note("scheduler.params.warmup_num_steps", std::to_string(*s.warmup_num_steps), "the program's warmup steps");
    }
    if (total && !s.total_num_steps) {
      if (!in_.total_steps) {
        fail("scheduler.params.total_num_steps",
             "\"auto\" needs the number of optimizer steps of the run: pass --total-steps N to `zero3 config "
             "check` (ResolveInputs::total_steps in a program)");
      }
      s.total_num_steps = in_.total_steps;
      note("scheduler.params.total_num_steps", std::to_string(*s.total_num_steps), "the program's total steps");
    }
  }

  // ----- pipeline: the stages divide the world; the batch arithmetic counts data-parallel ranks -----
  void pipeline_stages() {
    const char* kStages = "pipeline.stages";
    auto& stages = c_.pipeline.stages;
    if (in_.pipeline_stages && *in_.pipeline_stages < 1) {
      fail(kStages, "the program passes " + std::to_string(*in_.pipeline_stages) + ", expected an integer >= 1");
    }
    if (!stages) {
      stages = in_.pipeline_stages.value_or(1);
      if (was_auto(kStages)) {
        note(kStages, std::to_string(*stages), in_.pipeline_stages ? "the program's stages" : "no pipeline");
      }
    } else if (in_.pipeline_stages && *in_.pipeline_stages != *stages) {
      fail(kStages, "got " + std::to_string(*stages) + ", but the program passes " +
                        std::to_string(*in_.pipeline_stages) + "; expected the same value, or \"auto\"");
    }
    if (*stages > world_ || world_ % *stages != 0) {
      fail(kStages, std::to_string(*stages) + " stages do not divide the world size " + std::to_string(world_) +
                        "; every stage needs the same number of data-parallel ranks");
    }
    data_parallel_ = world_ / *stages;
  }

  // The schedule fits the stages and the micro-batches (pipeline_schedule.hpp names the key and the numbers).
  void pipeline_schedule() {
    const auto kind = pipeline::parse_schedule(c_.zero3.pipeline_schedule, "zero3.pipeline_schedule");
    if (*c_.pipeline.stages == 1 && c_.zero3.pipeline_virtual_stages == 1) return;
    try {
      pipeline::make_schedule(kind, static_cast<int>(*c_.pipeline.stages),
                              static_cast<int>(std::min<int64_t>(*c_.gradient_accumulation_steps, 1 << 20)),
                              static_cast<int>(std::min<int64_t>(c_.zero3.pipeline_virtual_stages, 4096)));
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (in " + c_.source + ")");
    }
  }

  // "world size 8", or with a pipeline "data-parallel size 2 (world size 8 / pipeline.stages 4)".
  std::string ranks_text() const {
    if (data_parallel_ == world_) return "world size " + std::to_string(world_);
    return "data-parallel size " + std::to_string(data_parallel_) + " (world size " + std::to_string(world_) +
           " / pipeline.stages " + std::to_string(world_ / data_parallel_) + ")";
  }

  // ----- batch sizes: Hugging Face fills "auto", then DeepSpeed's inference and consistency rule -----
  void program_value(std::string_view path, std::optional<int64_t>& field, const std::optional<int64_t>& input,
                     const char* flag, const char* input_name) {
    if (input && *input < 1) {
      fail(path, "the program passes " + std::to_string(*input) + " (" + flag + "), expected an integer >= 1");
    }
    if (!field) {
      if (input) {
        field = input;
        if (was_auto(path)) note(path, std::to_string(*field), std::string("the program's ") + flag);
      } else if (was_auto(path)) {
        fail(path, std::string("\"auto\" needs the program's value: pass ") + flag + " N to `zero3 config check` (" +
                       input_name + " in a program)");
      }
    } else if (input && *input != *field) {
      fail(path, "got " + std::to_string(*field) + ", but the program passes " + std::to_string(*input) + " (" + flag +
                     "); expected the same value, or \"auto\"");
    }
  }

  void batch() {
    const char* kTb = "train_batch_size";
    const char* kMb = "train_micro_batch_size_per_gpu";
    const char* kGa = "gradient_accumulation_steps";
    auto& tb = c_.train_batch_size;
    auto& mb = c_.train_micro_batch_size_per_gpu;
    auto& ga = c_.gradient_accumulation_steps;
    program_value(kMb, mb, in_.micro_batch, "--micro-batch", "ResolveInputs::micro_batch");
    program_value(kGa, ga, in_.grad_accum, "--grad-accum", "ResolveInputs::grad_accum");
    if (!tb && was_auto(kTb)) {
      if (!mb) {
        fail(kTb,
             "\"auto\" is micro batch x gradient accumulation x world size, and the micro batch is unknown: give "
             "train_micro_batch_size_per_gpu or pass --micro-batch N (ResolveInputs::micro_batch in a program)");
      }
      if (!ga) ga = 1;  // absent (an "auto" one was filled above or refused): DeepSpeed's default
      tb = product(*mb, *ga);
      note(kTb, std::to_string(*tb), "micro batch x gradient accumulation x world size");
    }
    // DeepSpeed's _set_batch_related_parameters: given two, infer the third; given one, accumulation is 1.
    bool inferred_tb = false, inferred_mb = false, inferred_ga = false;
    if (tb && mb && ga) {
    } else if (tb && mb) {
      ga = *tb / *mb / data_parallel_;
      inferred_ga = true;
    } else if (tb && ga) {
      mb = *tb / data_parallel_ / *ga;
      inferred_mb = true;
    } else if (mb && ga) {
      tb = product(*mb, *ga);
      inferred_tb = true;
    } else if (tb) {
      ga = 1;
      mb = *tb / data_parallel_;
      inferred_ga = inferred_mb = true;
    } else if (mb) {
      ga = 1;
      tb = product(*mb, 1);
      inferred_ga = inferred_tb = true;
    } else {
      fail(kTb,
           "missing, and train_micro_batch_size_per_gpu is missing too: give one of them (DeepSpeed needs one), or "
           "set them to \"auto\" and pass --micro-batch and --grad-accum");
    }
    if (*mb < 1 || *ga < 1 || *tb != product(*mb, *ga)) {
      auto term = [](const char* name, int64_t v, bool inferred) {
        return std::string(name) + " " + std::to_string(v) + (inferred ? " (inferred)" : "");
      };
      fail(kTb, "got " + std::to_string(*tb) + ", expected " +
                    term("train_micro_batch_size_per_gpu", *mb, inferred_mb) + " x " +
                    term("gradient_accumulation_steps", *ga, inferred_ga) + " x " + ranks_text() + " = " +
                    std::to_string(product(*mb, *ga)) + ", every factor >= 1 (DeepSpeed's rule)");
    }
    (void)inferred_tb;
  }

  // micro batch x gradient accumulation x world size, or an error naming the three when it does not fit.
  int64_t product(int64_t mb, int64_t ga) const {
    int64_t p = 0;
    if (__builtin_mul_overflow(mb, ga, &p) || __builtin_mul_overflow(p, data_parallel_, &p)) {
      fail("train_batch_size", "train_micro_batch_size_per_gpu " + std::to_string(mb) +
                                   " x gradient_accumulation_steps " + std::to_string(ga) + " x " + ranks_text() +
                                   " is beyond the largest 64-bit integer, 9223372036854775807");
    }
    return p;
  }

  // ----- NVMe swap directories -----
  void nvme_paths() {
    const std::string swap_dir = env::swap_dir();
    struct Item {
      OffloadConfig* offload;
      const char* path;
    } items[] = {{&c_.zero.offload_param, "zero_optimization.offload_param.nvme_path"},
                 {&c_.zero.offload_optimizer, "zero_optimization.offload_optimizer.nvme_path"}};
    for (Item& it : items) {
      if (it.offload->device != OffloadDevice::nvme) continue;
      if (!swap_dir.empty() && it.offload->nvme_path != swap_dir) {
        c_.warnings.push_back(std::string(it.path) + ": replaced by ZERO3_SWAP_DIR=" + swap_dir);
        log::warn_rank0(c_.source, ": ", c_.warnings.back());
        it.offload->nvme_path = swap_dir;
      }
      if (it.offload->nvme_path.empty()) {
        fail(it.path,
             "missing, expected a directory for the swap files with device \"nvme\" (for example "
             "\"/tmp/zero3-nvme\"), or set ZERO3_SWAP_DIR");
      }
    }
  }

  Config& c_;
  const ResolveInputs& in_;
  int64_t world_ = 1;
  int64_t data_parallel_ = 1;  // world_ / pipeline.stages
  std::vector<std::string> notes_;
};

}  // namespace

void resolve(Config& config, const ResolveInputs& inputs) { Resolver(config, inputs).run(); }

}  // namespace zero3

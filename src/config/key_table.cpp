#include "config/key_table.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <regex>
#include <string>

#include "zero3/error.hpp"

// The table uses designated initializers that leave trailing members at their defaults; GCC 12 warns
// about that under -Wextra although it is well-defined.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace zero3::config_detail {
namespace {

using J = nlohmann::ordered_json;
using Emitted = std::optional<J>;
using S = KeyStatus;

// pipeline.partition "type:REGEX": the expression must compile (ECMAScript, case-insensitive, as the partitioner
// matches layer names).
void check_partition_regex(const Value& v, const std::string& expression) {
  try {
    std::regex(expression, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error& e) {
    v.fail_with("\"type:" + expression + "\": the regular expression does not compile (" + e.what() + ")");
  }
}

bool pending_auto(const Config& c, std::string_view path) {
  return !c.resolved && std::find(c.auto_keys.begin(), c.auto_keys.end(), path) != c.auto_keys.end();
}

// An optional field: its value, "auto" while the file's "auto" waits for resolve(), else null.
template <typename T>
Emitted value_or_auto(const Config& c, std::string_view path, const std::optional<T>& v) {
  if (v) return J(*v);
  if (std::find(c.auto_keys.begin(), c.auto_keys.end(), path) != c.auto_keys.end()) return J("auto");
  return J(nullptr);
}

template <typename T>
void set_or_auto(ReadContext& ctx, const Value& v, std::optional<T>& field, T value_if_not_auto) {
  if (v.is_auto()) {
    field.reset();
    ctx.mark_auto(v.path());
  } else {
    field = value_if_not_auto;
  }
}

const char* device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::none:
      return "none";
    case OffloadDevice::cpu:
      return "cpu";
    case OffloadDevice::nvme:
      return "nvme";
  }
  return "none";
}

OffloadDevice read_device(const Value& v) {
  std::string d = v.as_choice({"none", "cpu", "nvme"});
  return d == "cpu" ? OffloadDevice::cpu : d == "nvme" ? OffloadDevice::nvme : OffloadDevice::none;
}

const char* network_name(NetworkTransport t) {
  switch (t) {
    case NetworkTransport::auto_detect:
      return "auto";
    case NetworkTransport::efa:
      return "efa";
    case NetworkTransport::socket:
      return "socket";
  }
  return "auto";
}

std::string dtype_config_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "fp32";
}

Emitted optional_dtype(const std::optional<DType>& t) { return t ? J(dtype_config_name(*t)) : J(nullptr); }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

void read_optimizer_type(ReadContext& ctx, const Value& v) {
  std::string name = v.as_string();
  std::string l = lower(name);
  if (l == "adam") {
    ctx.config.optimizer.type = OptimizerType::adam;
    return;
  }
  if (l == "adamw") {
    ctx.config.optimizer.type = OptimizerType::adamw;
    return;
  }
  static const std::vector<std::string_view> deepspeed_others = {
      "adagrad", "lamb", "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw", "musgd", "lion", "muon"};
  if (std::find(deepspeed_others.begin(), deepspeed_others.end(), l) != deepspeed_others.end()) {
    v.fail_with("\"" + name + "\" is not supported: zero3 implements Adam and AdamW only (DeepSpeed's " + name +
                " has its own update rule and state, which zero3 does not have); use \"Adam\" or \"AdamW\"");
  }
  v.fail_with("\"" + name +
              "\" is not supported: zero3 implements Adam and AdamW only (DeepSpeed would look this name up "
              "among the torch optimizers); use \"Adam\" or \"AdamW\"");
}

void read_scheduler_type(ReadContext& ctx, const Value& v) {
  std::string name = v.as_string();
  SchedulerConfig& s = ctx.config.scheduler;
  if (name == "WarmupLR") {
    s.type = SchedulerType::warmup_lr;
  } else if (name == "WarmupDecayLR") {
    s.type = SchedulerType::warmup_decay_lr;
  } else if (name == "WarmupCosineLR") {
    s.type = SchedulerType::warmup_cosine_lr;
  } else if (name == "OneCycle") {
    s.type = SchedulerType::one_cycle;
  } else if (name == "LRRangeTest") {
    v.fail_with(
        "\"LRRangeTest\" is not supported: it is a learning-rate search, not a training schedule; use "
        "WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle");
  } else {
    v.fail(
        "one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\" or \"OneCycle\" (exact case, as in "
        "DeepSpeed)");
  }
}

void read_betas(ReadContext& ctx, const Value& v) {
  OptimizerConfig& o = ctx.config.optimizer;
  if (v.is_auto()) {
    ctx.mark_auto(v.path());
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    return;
  }
  const nlohmann::json& j = v.json();
  if (!j.is_array() || j.size() != 2 || !j[0].is_number() || !j[1].is_number()) {
    v.fail("two numbers [beta1, beta2], each in [0, 1)");
  }
  double b1 = j[0].get<double>(), b2 = j[1].get<double>();
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1)) v.fail("two numbers [beta1, beta2], each in [0, 1)");
  o.beta1 = b1;
  o.beta2 = b2;
}

Emitted when_optimizer(const Config& c, J value) {
  if (!c.optimizer.present) return std::nullopt;
  return value;
}

Emitted when_scheduler(const Config& c, J value) {
  if (c.scheduler.type == SchedulerType::none) return std::nullopt;
  return value;
}

// Integer keys with a lower bound; F is the field as an expression of `c`.
#define KEY_INT(P, F, DEF, MIN, DOC)                               \
  {                                                                \
    .path = P, .type = "integer", .default_json = DEF, .doc = DOC, \
    .apply =                                                       \
        [](ReadContext& ctx, const Value& v) {                     \
          Config& c = ctx.config;                                  \
          F = v.as_int(MIN);                                       \
        },                                                         \
    .emit = [](const Config& c) -> Emitted { return J(F); }        \
  }

#define KEY_INT_AUTO(P, F, DEF, MIN, DOC)                                                       \
  {                                                                                             \
    .path = P, .type = "integer or \"auto\"", .default_json = DEF, .doc = DOC, .auto_ok = true, \
    .apply =                                                                                    \
        [](ReadContext& ctx, const Value& v) {                                                  \
          Config& c = ctx.config;                                                               \
          set_or_auto(ctx, v, F, v.is_auto() ? int64_t{0} : v.as_int(MIN));                     \
        },                                                                                      \
    .emit = [](const Config& c) -> Emitted { return value_or_auto(c, P, F); }                   \
  }

#define KEY_NUM(P, F, DEF, MIN, MAX, DOC)                         \
  {                                                               \
    .path = P, .type = "number", .default_json = DEF, .doc = DOC, \
    .apply =                                                      \
        [](ReadContext& ctx, const Value& v) {                    \
          Config& c = ctx.config;                                 \
          F = v.as_number(MIN, MAX);                              \
        },                                                        \
    .emit = [](const Config& c) -> Emitted { return J(F); }       \
  }

#define KEY_BOOL(P, F, DEF, DOC)                                   \
  {                                                                \
    .path = P, .type = "boolean", .default_json = DEF, .doc = DOC, \
    .apply =                                                       \
        [](ReadContext& ctx, const Value& v) {                     \
          Config& c = ctx.config;                                  \
          F = v.as_bool();                                         \
        },                                                         \
    .emit = [](const Config& c) -> Emitted { return J(F); }        \
  }

#define KEY_STRING(P, F, DEF, DOC)                                \
  {                                                               \
    .path = P, .type = "string", .default_json = DEF, .doc = DOC, \
    .apply =                                                      \
        [](ReadContext& ctx, const Value& v) {                    \
          Config& c = ctx.config;                                 \
          F = v.as_string();                                      \
        },                                                        \
    .emit = [](const Config& c) -> Emitted { return J(F); }       \
  }

#define SECTION(P, DOC) \
  { .path = P, .type = "object", .default_json = "", .doc = DOC }

#define ALIAS(P, TARGET) \
  { .path = P, .type = "", .default_json = "", .status = S::alias, .doc = "", .alias_of = TARGET }

#define DEPRECATED(P, TARGET, DOC) \
  { .path = P, .type = "", .default_json = "", .status = S::deprecated, .doc = DOC, .alias_of = TARGET }

#define IGNORED(P, TYPE, DEF, WHEN, DOC) \
  { .path = P, .type = TYPE, .default_json = DEF, .status = S::ignored, .doc = DOC, .when = When::WHEN }

#define REFUSED(P, TYPE, DEF, WHEN, DOC) \
  { .path = P, .type = TYPE, .default_json = DEF, .status = S::refused, .doc = DOC, .when = When::WHEN }

// Optimizer and scheduler parameters are written only when their section is.
#define OPT_NUM_AUTO(P, F, DEF, MIN, DOC)                                                         \
  {                                                                                               \
    .path = P, .type = "number or \"auto\"", .default_json = DEF, .doc = DOC, .auto_ok = true,    \
    .apply =                                                                                      \
        [](ReadContext& ctx, const Value& v) {                                                    \
          Config& c = ctx.config;                                                                 \
          set_or_auto(ctx, v, F, v.is_auto() ? 0.0 : v.as_number(MIN));                           \
        },                                                                                        \
    .emit = [](const Config& c) -> Emitted { return when_optimizer(c, *value_or_auto(c, P, F)); } \
  }

#define OPT_BOOL(P, F, DEF, DOC)                                               \
  {                                                                            \
    .path = P, .type = "boolean", .default_json = DEF, .doc = DOC,             \
    .apply =                                                                   \
        [](ReadContext& ctx, const Value& v) {                                 \
          Config& c = ctx.config;                                              \
          F = v.as_bool();                                                     \
        },                                                                     \
    .emit = [](const Config& c) -> Emitted { return when_optimizer(c, J(F)); } \
  }

#define SCHED_NUM(P, F, DEF, MIN, ONLY, DOC)                                        \
  {                                                                                 \
    .path = P, .type = "number", .default_json = DEF, .doc = DOC, .only_for = ONLY, \
    .apply =                                                                        \
        [](ReadContext& ctx, const Value& v) {                                      \
          Config& c = ctx.config;                                                   \
          F = v.as_number(MIN);                                                     \
        },                                                                          \
    .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(F)); }      \
  }

#define SCHED_INT(P, F, DEF, MIN, ONLY, DOC)                                         \
  {                                                                                  \
    .path = P, .type = "integer", .default_json = DEF, .doc = DOC, .only_for = ONLY, \
    .apply =                                                                         \
        [](ReadContext& ctx, const Value& v) {                                       \
          Config& c = ctx.config;                                                    \
          F = v.as_int(MIN);                                                         \
        },                                                                           \
    .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(F)); }       \
  }

#define SCHED_BOOL(P, F, DEF, ONLY, DOC)                                             \
  {                                                                                  \
    .path = P, .type = "boolean", .default_json = DEF, .doc = DOC, .only_for = ONLY, \
    .apply =                                                                         \
        [](ReadContext& ctx, const Value& v) {                                       \
          Config& c = ctx.config;                                                    \
          F = v.as_bool();                                                           \
        },                                                                           \
    .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(F)); }       \
  }

#define SCHED_INT_AUTO(P, F, DEF, MIN, ONLY, DOC)                                                                 \
  {                                                                                                               \
    .path = P, .type = "integer or \"auto\"", .default_json = DEF, .doc = DOC, .auto_ok = true, .only_for = ONLY, \
    .apply =                                                                                                      \
        [](ReadContext& ctx, const Value& v) {                                                                    \
          Config& c = ctx.config;                                                                                 \
          set_or_auto(ctx, v, F, v.is_auto() ? int64_t{0} : v.as_int(MIN));                                       \
        },                                                                                                        \
    .emit = [](const Config& c) -> Emitted { return when_scheduler(c, *value_or_auto(c, P, F)); }                 \
  }

// Offload keys exist twice, once per offload section.
#define OFFLOAD_COMMON(SEC, MEMBER, BUFFERS, BUFFERS_DOC)                                                        \
  {.path = SEC ".device",                                                                                        \
   .type = "string",                                                                                             \
   .default_json = "\"none\"",                                                                                   \
   .doc =                                                                                                        \
       "Where the state lives between uses: \"none\" (the device), \"cpu\" (host memory), \"nvme\" (files "      \
       "under nvme_path).",                                                                                      \
   .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero.MEMBER.device = read_device(v); },            \
   .emit = [](const Config& c) -> Emitted { return J(device_name(c.zero.MEMBER.device)); }},                     \
      {.path = SEC ".nvme_path",                                                                                 \
       .type = "string",                                                                                         \
       .default_json = "null",                                                                                   \
       .doc =                                                                                                    \
           "Directory for the swap files (device \"nvme\"). It must exist and be writable when the run starts; " \
           "ZERO3_SWAP_DIR replaces it. The canonical configs use /tmp/zero3-nvme.",                             \
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero.MEMBER.nvme_path = v.as_string(); },      \
       .emit = [](const Config& c) -> Emitted {                                                                  \
         return c.zero.MEMBER.nvme_path.empty() ? J(nullptr) : J(c.zero.MEMBER.nvme_path);                       \
       }},                                                                                                       \
      {.path = SEC ".pin_memory",                                                                                \
       .type = "boolean",                                                                                        \
       .default_json = "false",                                                                                  \
       .doc =                                                                                                    \
           "Page-locked host buffers for faster, asynchronous device<->host copies (DeepSpeed 0.19.4 and later " \
           "default to true).",                                                                                  \
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero.MEMBER.pin_memory = v.as_bool(); },       \
       .emit = [](const Config& c) -> Emitted { return J(c.zero.MEMBER.pin_memory); }},                          \
  {                                                                                                              \
    .path = SEC ".buffer_count", .type = "integer", .default_json = BUFFERS, .doc = BUFFERS_DOC,                 \
    .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero.MEMBER.buffer_count = v.as_int(1); },        \
    .emit = [](const Config& c) -> Emitted { return J(c.zero.MEMBER.buffer_count); }                             \
  }

std::vector<KeyEntry> build_table() {
  return {
      // ----- batch size -----
      KEY_INT_AUTO("train_batch_size", c.train_batch_size, "null", 1,
                   "Samples per optimizer step over all ranks: train_micro_batch_size_per_gpu x "
                   "gradient_accumulation_steps x world size (with a pipeline, x the data-parallel size: the world "
                   "size over pipeline.stages). Given two of the three, the third is inferred (DeepSpeed's rule); all "
                   "three must agree. \"auto\": micro batch x grad accum x that size."),
      KEY_INT_AUTO("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, "null", 1,
                   "Samples per rank per forward/backward. \"auto\": the program's micro batch (--micro-batch)."),
      KEY_INT_AUTO("gradient_accumulation_steps", c.gradient_accumulation_steps, "null", 1,
                   "Micro batches accumulated per optimizer step. \"auto\": the program's value (--grad-accum)."),
      IGNORED("managed_gradient_accumulation", "boolean", "true", not_default,
              "Pipeline-engine detail; zero3 always accumulates over gradient_accumulation_steps."),

      // ----- optimizer -----
      {.path = "optimizer",
       .type = "object",
       .default_json = "",
       .doc = "The optimizer zero3 runs on each rank's shard. Without this section the program chooses "
              "(the examples use AdamW).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.optimizer.present = true;
             if (!v.json().contains("type")) {
               throw ConfigError(error_text(v.path() + ".type", "missing; expected \"Adam\" or \"AdamW\"", ctx.source));
             }
           }},
      {.path = "optimizer.type",
       .type = "string",
       .default_json = "",
       .doc = "\"Adam\" or \"AdamW\" (any case). As in DeepSpeed, \"Adam\" runs AdamW (decoupled weight decay) "
              "unless params.adam_w_mode is false. DeepSpeed's other optimizers (Adagrad, Lamb, OneBitAdam, "
              "ZeroOneAdam, OneBitLamb, MuAdam, MuAdamW, MuSGD, Lion, Muon) and torch optimizer names are "
              "refused: zero3 does not implement their update rules.",
       .apply = read_optimizer_type,
       .emit = [](const Config& c) -> Emitted {
         return when_optimizer(c, J(c.optimizer.type == OptimizerType::adam ? "Adam" : "AdamW"));
       }},
      SECTION("optimizer.params", "The optimizer's hyper-parameters."),
      OPT_NUM_AUTO("optimizer.params.lr", c.optimizer.lr, "0.001", 0.0,
                   "Learning rate (the scheduler's base). \"auto\": the program's learning rate (--lr)."),
      {.path = "optimizer.params.betas",
       .type = "[number, number] or \"auto\"",
       .default_json = "[0.9, 0.999]",
       .doc = "Adam's beta1, beta2. \"auto\": the program's values, else 0.9, 0.999 (Hugging Face's defaults).",
       .auto_ok = true,
       .apply = read_betas,
       .emit = [](const Config& c) -> Emitted {
         if (pending_auto(c, "optimizer.params.betas")) return when_optimizer(c, J("auto"));
         return when_optimizer(c, J::array({c.optimizer.beta1, c.optimizer.beta2}));
       }},
      {.path = "optimizer.params.eps",
       .type = "number or \"auto\"",
       .default_json = "1e-08",
       .doc = "Adam's epsilon. \"auto\": the program's value, else 1e-8.",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (v.is_auto()) {
               ctx.mark_auto(v.path());
               ctx.config.optimizer.eps = 1e-8;
             } else {
               ctx.config.optimizer.eps = v.as_number(0.0);
             }
           },
       .emit = [](const Config& c) -> Emitted {
         if (pending_auto(c, "optimizer.params.eps")) return when_optimizer(c, J("auto"));
         return when_optimizer(c, J(c.optimizer.eps));
       }},
      OPT_NUM_AUTO("optimizer.params.weight_decay", c.optimizer.weight_decay, "0", 0.0,
                   "Weight decay: decoupled (AdamW) or L2 (Adam with adam_w_mode false). \"auto\": the program's "
                   "value, else 0."),
      OPT_BOOL("optimizer.params.bias_correction", c.optimizer.bias_correction, "true",
               "Adam's bias correction of the moments."),
      OPT_BOOL("optimizer.params.adam_w_mode", c.optimizer.adam_w_mode, "true",
               "With type \"Adam\": true runs AdamW, false runs Adam with L2 weight decay. Type \"AdamW\" is always "
               "AdamW."),
      REFUSED("optimizer.params.amsgrad", "boolean", "false", not_default,
              "AMSGrad keeps a running maximum of the second moment, a different update that zero3 does not "
              "implement."),
      REFUSED("optimizer.params.fp32_optimizer_states", "boolean", "true", not_default,
              "zero3 keeps Adam's moments in fp32; 16-bit moments would change the results."),
      IGNORED("optimizer.params.torch_adam", "boolean", "false", not_default,
              "Chooses PyTorch's Adam over DeepSpeed's fused one; zero3 has one implementation with the same math."),
      IGNORED("optimizer.params.set_grad_none", "boolean", "true", not_default,
              "PyTorch memory detail: zero3 clears gradients itself."),
      REFUSED("optimizer.params.max_grad_norm", "number", "", present,
              "Not an optimizer parameter (DeepSpeed refuses it too): use the top-level gradient_clipping."),
      IGNORED("optimizer.legacy_fusion", "boolean", "false", not_default, "Old fused-kernel switch; no effect."),

      // ----- scheduler -----
      {.path = "scheduler",
       .type = "object",
       .default_json = "",
       .doc = "Learning-rate schedule, DeepSpeed's arithmetic. Without it the learning rate is constant. Each "
              "parameter belongs to the types listed with it; another type's parameter is an error, as in "
              "DeepSpeed.",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (!v.json().contains("type")) {
               throw ConfigError(error_text(
                   v.path() + ".type",
                   "missing; expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\" or \"OneCycle\"",
                   ctx.source));
             }
           }},
      {.path = "scheduler.type",
       .type = "string",
       .default_json = "",
       .doc = "\"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\" or \"OneCycle\" (exact case). \"LRRangeTest\" "
              "is refused: it is a learning-rate search, not a training schedule.",
       .apply = read_scheduler_type,
       .emit = [](const Config& c) -> Emitted {
         return when_scheduler(c, J(std::string(scheduler_type_name(c.scheduler.type))));
       }},
      SECTION("scheduler.params", "The schedule's parameters (DeepSpeed's names)."),
      {.path = "scheduler.params.warmup_min_lr",
       .type = "number or \"auto\"",
       .default_json = "0",
       .doc = "Learning rate at the start of the warmup. \"auto\": 0.",
       .auto_ok = true,
       .only_for = "WarmupLR WarmupDecayLR",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (v.is_auto()) ctx.mark_auto(v.path());
             ctx.config.scheduler.warmup_min_lr = v.is_auto() ? 0.0 : v.as_number(0.0);
           },
       .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(c.scheduler.warmup_min_lr)); }},
      {.path = "scheduler.params.warmup_max_lr",
       .type = "number or \"auto\"",
       .default_json = "0.001",
       .doc = "Learning rate at the end of the warmup. WarmupLR without it uses optimizer.params.lr. \"auto\": the "
              "program's learning rate (--lr), else optimizer.params.lr.",
       .auto_ok = true,
       .only_for = "WarmupLR WarmupDecayLR",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.warmup_max_lr_given = true;
             set_or_auto(ctx, v, ctx.config.scheduler.warmup_max_lr, v.is_auto() ? 0.0 : v.as_number(0.0));
           },
       .emit = [](const Config& c) -> Emitted {
         return when_scheduler(c, *value_or_auto(c, "scheduler.params.warmup_max_lr", c.scheduler.warmup_max_lr));
       }},
      SCHED_INT_AUTO("scheduler.params.warmup_num_steps", c.scheduler.warmup_num_steps, "1000", 1,
                     "WarmupLR WarmupDecayLR WarmupCosineLR",
                     "Steps of warmup (at least 2 are used, as in DeepSpeed). \"auto\": the program's warmup steps "
                     "(--warmup-steps)."),
      {.path = "scheduler.params.warmup_type",
       .type = "string",
       .default_json = "\"log\"",
       .doc = "Shape of the warmup: \"log\" or \"linear\" (DeepSpeed falls back to log for anything else; zero3 "
              "refuses it).",
       .only_for = "WarmupLR WarmupDecayLR WarmupCosineLR",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.scheduler.warmup_type = v.as_choice({"log", "linear"});
           },
       .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(c.scheduler.warmup_type)); }},
      SCHED_INT_AUTO("scheduler.params.total_num_steps", c.scheduler.total_num_steps, "", 1,
                     "WarmupDecayLR WarmupCosineLR",
                     "Required: the optimizer steps of the whole run, where the decay ends. \"auto\": the program's "
                     "total steps (--total-steps)."),
      SCHED_NUM("scheduler.params.warmup_min_ratio", c.scheduler.warmup_min_ratio, "0", 0.0, "WarmupCosineLR",
                "Warmup starts at this fraction of the optimizer's lr."),
      SCHED_NUM("scheduler.params.cos_min_ratio", c.scheduler.cos_min_ratio, "0.0001", 0.0, "WarmupCosineLR",
                "The cosine decay ends at this fraction of the optimizer's lr."),
      {.path = "scheduler.params.cycle_min_lr",
       .type = "number",
       .default_json = "",
       .doc = "Required: the lowest learning rate of the cycle.",
       .only_for = "OneCycle",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.scheduler.cycle_min_lr = v.as_number(0.0); },
       .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(c.scheduler.cycle_min_lr)); }},
      {.path = "scheduler.params.cycle_max_lr",
       .type = "number",
       .default_json = "",
       .doc = "Required: the highest learning rate of the cycle.",
       .only_for = "OneCycle",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.scheduler.cycle_max_lr = v.as_number(0.0); },
       .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(c.scheduler.cycle_max_lr)); }},
      SCHED_NUM("scheduler.params.decay_lr_rate", c.scheduler.decay_lr_rate, "0", 0.0, "OneCycle",
                "Learning-rate decay rate after the cycle."),
      SCHED_INT("scheduler.params.cycle_first_step_size", c.scheduler.cycle_first_step_size, "2000", 1, "OneCycle",
                "Steps of the increasing half of the cycle."),
      {.path = "scheduler.params.cycle_second_step_size",
       .type = "integer",
       .default_json = "null",
       .doc = "Steps of the decreasing half; null: cycle_first_step_size.",
       .only_for = "OneCycle",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.scheduler.cycle_second_step_size = v.as_int(1); },
       .emit = [](const Config& c) -> Emitted {
         const auto& s = c.scheduler.cycle_second_step_size;
         return when_scheduler(c, s ? J(*s) : J(nullptr));
       }},
      SCHED_INT("scheduler.params.cycle_first_stair_count", c.scheduler.cycle_first_stair_count, "0", 0, "OneCycle",
                "Stairs in the first half (0: a continuous ramp)."),
      {.path = "scheduler.params.cycle_second_stair_count",
       .type = "integer",
       .default_json = "null",
       .doc = "Stairs in the second half; null: cycle_first_stair_count.",
       .only_for = "OneCycle",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.cycle_second_stair_count_given = true;
             ctx.config.scheduler.cycle_second_stair_count = v.as_int(0);
           },
       .emit = [](const Config& c) -> Emitted { return when_scheduler(c, J(c.scheduler.cycle_second_stair_count)); }},
      SCHED_INT("scheduler.params.decay_step_size", c.scheduler.decay_step_size, "0", 0, "OneCycle",
                "Steps between decays after the cycle (0: no decay)."),
      SCHED_BOOL("scheduler.params.cycle_momentum", c.scheduler.cycle_momentum, "true", "OneCycle",
                 "Cycle Adam's beta1 between cycle_max_mom and cycle_min_mom (beta2 becomes 0.99, as in DeepSpeed)."),
      SCHED_NUM("scheduler.params.cycle_min_mom", c.scheduler.cycle_min_mom, "0.8", 0.0, "OneCycle",
                "Lowest beta1 of the cycle."),
      SCHED_NUM("scheduler.params.cycle_max_mom", c.scheduler.cycle_max_mom, "0.9", 0.0, "OneCycle",
                "Highest beta1 of the cycle."),
      SCHED_NUM("scheduler.params.decay_mom_rate", c.scheduler.decay_mom_rate, "0", 0.0, "OneCycle",
                "Momentum decay rate after the cycle."),
      {.path = "scheduler.params.last_batch_iteration",
       .type = "integer",
       .default_json = "-1",
       .status = S::refused,
       .doc = "Starts the schedule part-way; zero3 restores the schedule's position from the checkpoint instead.",
       .when = When::not_default,
       .only_for = "WarmupLR WarmupDecayLR WarmupCosineLR OneCycle"},

      // ----- gradients and communication -----
      {.path = "gradient_clipping",
       .type = "number or \"auto\"",
       .default_json = "0",
       .doc = "Clip the global gradient norm to this value; 0: no clipping (DeepSpeed 0.18's default; 0.19.3 and "
              "later default to 1.0). \"auto\": the program's max grad norm, else 1.0 (Hugging Face's default).",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             set_or_auto(ctx, v, ctx.config.gradient_clipping, v.is_auto() ? 0.0 : v.as_number(0.0));
           },
       .emit = [](const Config& c) -> Emitted { return value_or_auto(c, "gradient_clipping", c.gradient_clipping); }},
      KEY_BOOL("prescale_gradients", c.prescale_gradients, "false",
               "Divide gradients by gradient_predivide_factor before the reduction instead of by the world size "
               "after it."),
      {.path = "gradient_predivide_factor",
       .type = "number",
       .default_json = "1.0",
       .doc = "Pre-division factor for prescale_gradients (> 0).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             double f = v.as_number(0.0);
             if (f <= 0) v.fail("a number > 0");
             ctx.config.gradient_predivide_factor = f;
           },
       .emit = [](const Config& c) -> Emitted { return J(c.gradient_predivide_factor); }},
      REFUSED("gradient_allreduce_op", "string", "\"mean\"", not_default,
              "Only \"mean\" (the average of the ranks' gradients); \"sum\" changes the effective learning rate and "
              "DeepSpeed refuses it with stage 3 too."),
      {.path = "communication_data_type",
       .type = "string",
       .default_json = "null",
       .doc = "Data type gradients are reduced in, on the wire and in the reduction buckets: \"fp32\", \"fp16\" "
              "or \"bf16\". null: as DeepSpeed, the compute precision (bf16 under bf16.enabled, fp16 under "
              "fp16.enabled, else fp32). A gradient element costs 2 bytes in bf16/fp16 and 4 in fp32 per hop: a "
              "reduce-scatter over W ranks sends (W-1)/W x 2 (or 4) bytes per element of the model per rank and "
              "micro-step. 16-bit partial sums are rounded to 16 bits at each hop (as NCCL does); \"fp32\" sums "
              "exactly. Local accumulation stays in data_types.grad_accum_dtype (fp32 by default).",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.communication_data_type = v.as_dtype(); },
       .emit = [](const Config& c) -> Emitted { return optional_dtype(c.communication_data_type); }},
      IGNORED("seq_parallel_communication_data_type", "string", "\"fp32\"", not_default,
              "zero3 has no sequence parallelism."),
      REFUSED("sparse_gradients", "boolean", "false", not_default,
              "Sparse embedding gradients are not implemented; zero3's gradients are dense."),
      IGNORED("disable_allgather", "boolean", "false", not_default,
              "Old broadcast-instead-of-allgather switch; zero3 always all-gathers (same values)."),

      // ----- logging -----
      KEY_INT("steps_per_print", c.steps_per_print, "10", 1,
              "Print loss, learning rate, grad norm, tokens/s and memory every N optimizer steps."),
      KEY_BOOL("wall_clock_breakdown", c.wall_clock_breakdown, "false",
               "Time forward, backward, reductions and the optimizer step and print the breakdown."),
      IGNORED("memory_breakdown", "boolean", "false", not_default,
              "PyTorch allocator report; zero3's steps_per_print line already shows memory."),
      KEY_BOOL("dump_state", c.dump_state, "false",
               "Read; no effect yet: zero3 logs the resolved config at start-up regardless."),
      IGNORED("log_level", "string", "null", present, "Set ZERO3_LOG_LEVEL (error, warn, info, debug) instead."),
      IGNORED("vocabulary_size", "integer", "null", present, "Only feeds a DeepSpeed alignment warning."),
      IGNORED("dataloader_drop_last", "boolean", "false", not_default,
              "zero3 has no data loader; the training program owns its data."),
      IGNORED("zero_allow_untested_optimizer", "boolean", "false", not_default,
              "zero3 runs only its own Adam/AdamW, which are tested."),
      IGNORED("zero_force_ds_cpu_optimizer", "boolean", "true", not_default,
              "zero3 always runs its own CPU Adam for offloaded optimizer state."),
      IGNORED("graph_harvesting", "boolean", "false", not_default, "CUDA-graph capture of DeepSpeed's kernels."),
      IGNORED("use_data_before_expert_parallelism", "boolean", "false", not_default,
              "zero3 has no expert parallelism."),

      // ----- precision -----
      SECTION("fp16", "fp16 mixed precision: fp16 compute copies, fp32 master weights, dynamic loss scaling."),
      {.path = "fp16.enabled",
       .type = "boolean or \"auto\"",
       .default_json = "false",
       .doc = "fp16 compute. \"auto\": on when the program's precision is fp16 (--precision). A config without "
              "an fp16 section gets it enabled when the program's precision is fp16, as Accelerate fills it.",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (v.is_auto()) {
               ctx.mark_auto(v.path());
               ctx.config.fp16.auto_enabled = true;
               ctx.config.fp16.enabled = false;
             } else {
               ctx.config.fp16.enabled = v.as_bool();
             }
           },
       .emit = [](const Config& c) -> Emitted {
         return c.fp16.auto_enabled && !c.resolved ? J("auto") : J(c.fp16.enabled);
       }},
      IGNORED("fp16.auto_cast", "boolean", "false", not_default,
              "Casts a PyTorch module's floating inputs; zero3's programs feed token ids and cast themselves."),
      KEY_NUM("fp16.loss_scale", c.fp16.loss_scale, "0", 0.0, std::numeric_limits<double>::infinity(),
              "Static loss scale; 0: dynamic loss scaling."),
      KEY_INT("fp16.initial_scale_power", c.fp16.initial_scale_power, "16", 0,
              "Dynamic scaling starts at 2^initial_scale_power."),
      KEY_INT("fp16.loss_scale_window", c.fp16.loss_scale_window, "1000", 1,
              "Steps without overflow before the scale doubles."),
      KEY_INT("fp16.hysteresis", c.fp16.hysteresis, "2", 1, "Overflows tolerated before the scale halves."),
      KEY_BOOL("fp16.consecutive_hysteresis", c.fp16.consecutive_hysteresis, "false",
               "Refill the hysteresis after every step without overflow."),
      {.path = "fp16.min_loss_scale",
       .type = "number",
       .default_json = "1",
       .doc = "Lowest dynamic loss scale (> 0).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             double m = v.as_number(0.0);
             if (m <= 0) v.fail("a number > 0");
             ctx.config.fp16.min_loss_scale = m;
           },
       .emit = [](const Config& c) -> Emitted { return J(c.fp16.min_loss_scale); }},
      REFUSED("fp16.fp16_master_weights_and_grads", "boolean", "false", not_default,
              "zero3 keeps fp32 master weights and gradients; fp16 ones would change the results."),
      SECTION("bf16", "bf16 mixed precision: bf16 compute copies, fp32 master weights, no loss scaling."),
      {.path = "bf16.enabled",
       .type = "boolean or \"auto\"",
       .default_json = "false",
       .doc = "bf16 compute. \"auto\": on when the program's precision is bf16 (--precision). A config without "
              "a bf16 section gets it enabled when the program's precision is bf16, as Accelerate fills it.",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (v.is_auto()) {
               ctx.mark_auto(v.path());
               ctx.config.bf16.auto_enabled = true;
               ctx.config.bf16.enabled = false;
             } else {
               ctx.config.bf16.enabled = v.as_bool();
             }
           },
       .emit = [](const Config& c) -> Emitted {
         return c.bf16.auto_enabled && !c.resolved ? J("auto") : J(c.bf16.enabled);
       }},
      KEY_BOOL("bf16.immediate_grad_update", c.bf16.immediate_grad_update, "false",
               "Read; no effect: zero3 always adds each backward scope's gradients to the accumulator when it closes."),
      KEY_BOOL("bf16.check_grad_overflow", c.bf16.check_grad_overflow, "false",
               "Read; zero3 checks bf16 (and fp32) gradients for Inf/NaN and skips the step whatever this says."),
      REFUSED("bf16.bf16_master_weights_and_grads", "boolean", "false", not_default,
              "zero3 keeps fp32 master weights and gradients; bf16 ones would change the results."),
      REFUSED("bf16.bf16_optimizer_states", "boolean", "false", not_default,
              "zero3 keeps Adam's moments in fp32; bf16 ones would change the results."),
      DEPRECATED("bfloat16", "bf16", "The old name of the bf16 section."),
      REFUSED("amp", "object", "", enabled,
              "NVIDIA Apex AMP (opt_level O1/O2...) has its own casting rules; use the bf16 or fp16 section."),
      REFUSED("torch_autocast", "object", "", enabled,
              "PyTorch autocast decides per operation; zero3 computes in the bf16/fp16 section's type. Use those."),

      // ----- ZeRO -----
      {.path = "zero_optimization",
       .type = "object or boolean",
       .default_json = "",
       .doc = "ZeRO: partitioning of optimizer state (stage 1), gradients (2) and parameters (3) across ranks. "
              "The old boolean form (true: stage 1, with the top-level allgather_size) is accepted with a "
              "warning."},
      {.path = "zero_optimization.stage",
       .type = "integer",
       .default_json = "0",
       .doc = "0: plain data parallel; 1: optimizer state partitioned; 2: and gradients; 3: and parameters.",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero.stage = static_cast<int>(v.as_int(0, 3)); },
       .emit = [](const Config& c) -> Emitted { return J(c.zero.stage); }},
      KEY_BOOL("zero_optimization.contiguous_gradients", c.zero.contiguous_gradients, "true",
               "Write gradients into one contiguous buffer as they are produced (zero3 always uses flat per-unit "
               "buffers)."),
      KEY_BOOL("zero_optimization.reduce_scatter", c.zero.reduce_scatter, "true",
               "Reduce gradients with reduce-scatter (each rank gets its shard) rather than all-reduce."),
      KEY_INT_AUTO("zero_optimization.reduce_bucket_size", c.zero.reduce_bucket_size, "5e8", 0,
                   "Elements reduced per collective. 0: a bucket holds as many elements as the largest unit "
                   "(DeepSpeed reduces each parameter's gradient on its own with 0; zero3's units take the "
                   "place of its parameters). \"auto\": hidden_size^2 (--hidden-size)."),
      IGNORED("zero_optimization.use_multi_rank_bucket_allreduce", "boolean", "true", not_default,
              "Bucketing detail of DeepSpeed's stage 1/2 all-reduce; same values."),
      KEY_BOOL("zero_optimization.allgather_partitions", c.zero.allgather_partitions, "true",
               "Read; no effect: zero3 always gathers with all-gather."),
      KEY_INT("zero_optimization.allgather_bucket_size", c.zero.allgather_bucket_size, "5e8", 1,
              "Read; no effect yet: stages 1 and 2 all-gather one unit per collective."),
      {.path = "zero_optimization.overlap_comm",
       .type = "boolean",
       .default_json = "null",
       .doc = "Overlap gradient reduction with the backward pass. null: true at stage 3, false otherwise "
              "(DeepSpeed's rule).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero.overlap_comm = v.as_bool();
             ctx.config.zero.overlap_comm_set = true;
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero.overlap_comm); }},
      KEY_BOOL("zero_optimization.load_from_fp32_weights", c.zero.load_from_fp32_weights, "true",
               "Loading a checkpoint: keep its fp32 master weights (true) or round them to the compute dtype (false)."),
      IGNORED("zero_optimization.elastic_checkpoint", "boolean", "false", not_default,
              "zero3's checkpoints always load on any world size."),
      SECTION("zero_optimization.offload_param",
              "Parameter offload (ZeRO-Infinity); stage 3 only. Partitioned parameters live in host memory or "
              "NVMe and come to the device when their unit is gathered. Below stage 3 DeepSpeed ignores this "
              "section, and so does zero3, with a warning (device read as \"none\")."),
      OFFLOAD_COMMON("zero_optimization.offload_param", offload_param, "5",
                     "NVMe: host buffers the parameter slices are read into from the swap file, each the size of "
                     "the largest slice. Up to this many units' slices are read ahead of their all-gathers, along "
                     "the recorded order of units (while stage3_prefetch_bucket_size > 0); a buffer is free again "
                     "once its all-gather has read it."),
      KEY_INT("zero_optimization.offload_param.buffer_size", c.zero.offload_param.buffer_size, "1e8", 1,
              "NVMe: elements per read buffer, an upper bound: the largest parameter slice of a rank must fit "
              "(a ConfigError before training otherwise); the buffers are allocated at that slice's size."),
      KEY_INT("zero_optimization.offload_param.max_in_cpu", c.zero.offload_param.max_in_cpu, "1e9", 0,
              "Read; no effect: with NVMe every parameter slice lives in the swap file and host memory holds "
              "only the buffer_count read buffers."),
      SECTION("zero_optimization.offload_optimizer",
              "Optimizer offload (ZeRO-Offload): the fp32 master weights and Adam moments live in host memory "
              "(or NVMe) and the optimizer step runs on the CPU. Stages 1-3."),
      OFFLOAD_COMMON("zero_optimization.offload_optimizer", offload_optimizer, "4",
                     "Buffers in the pool for optimizer state swapped from NVMe (Adam needs 4: parameter, "
                     "gradient, two moments)."),
      KEY_BOOL("zero_optimization.offload_optimizer.pipeline_read", c.zero.offload_optimizer.pipeline_read, "false",
               "NVMe: read the next sub-group while the current one is updated."),
      KEY_BOOL("zero_optimization.offload_optimizer.pipeline_write", c.zero.offload_optimizer.pipeline_write, "false",
               "NVMe: write the previous sub-group while the current one is updated."),
      KEY_BOOL("zero_optimization.offload_optimizer.fast_init", c.zero.offload_optimizer.fast_init, "false",
               "Read; no effect: the swap file is preallocated once at start-up."),
      KEY_NUM("zero_optimization.offload_optimizer.ratio", c.zero.offload_optimizer.ratio, "1.0", 0.0, 1.0,
              "Read; no effect yet: with CPU offload the whole optimizer step runs on the CPU (ratio 1)."),
      IGNORED("zero_optimization.offload_optimizer.super_offload", "boolean", "false", not_default,
              "DeepSpeed's Grace-Hopper offload path; zero3's CPU Adam gives the same values."),
      IGNORED("zero_optimization.offload_optimizer.cpuadam_cores_perc", "number", "0.8", not_default,
              "Only for super_offload; zero3's CPU Adam uses OpenMP's threads."),
      REFUSED("zero_optimization.zenflow", "object", "null", present,
              "ZenFlow updates unimportant gradients asynchronously: different results from the ZeRO step."),
      {.path = "zero_optimization.sub_group_size",
       .type = "integer",
       .default_json = "1e9",
       .doc = "Elements per optimizer-step tile with offload: the unit of NVMe swapping and, on a GPU, of the "
              "gradient and parameter copies between device and host (two tiles of each staged in pinned "
              "memory). Tiles never span units. 0 (axolotl's ZeRO-3 configs) is read as 9223372036854775807, "
              "one tile per unit's owned range: DeepSpeed makes each parameter its own sub-group with 0, and a "
              "unit is zero3's closest equivalent.",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             int64_t n = v.as_int(0);
             if (n == 0) {
               n = std::numeric_limits<int64_t>::max();
               ctx.note(v.path() + ": 0 read as " + std::to_string(n) +
                        " (one tile per unit's owned range; DeepSpeed makes each parameter its own sub-group)");
             }
             ctx.config.zero.sub_group_size = n;
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero.sub_group_size); }},
      {.path = "zero_optimization.cpu_offload",
       .type = "boolean",
       .default_json = "null",
       .status = S::deprecated,
       .doc = "Old form of offload_optimizer: true means {\"device\": \"cpu\"}.",
       .alias_of = "zero_optimization.offload_optimizer",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.cpu_offload = v.as_bool();
             if (ctx.cpu_offload) ctx.config.zero.offload_optimizer.device = OffloadDevice::cpu;
           }},
      {.path = "zero_optimization.cpu_offload_param",
       .type = "boolean",
       .default_json = "null",
       .status = S::deprecated,
       .doc = "Old form of offload_param: true means {\"device\": \"cpu\"}.",
       .alias_of = "zero_optimization.offload_param",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.cpu_offload_param = v.as_bool();
             if (ctx.cpu_offload_param) ctx.config.zero.offload_param.device = OffloadDevice::cpu;
           }},
      {.path = "zero_optimization.cpu_offload_use_pin_memory",
       .type = "boolean",
       .default_json = "null",
       .status = S::deprecated,
       .doc = "Old form of pin_memory for offloads set with cpu_offload / cpu_offload_param.",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.cpu_offload_use_pin_memory = v.as_bool(); }},
      KEY_INT_AUTO("zero_optimization.stage3_prefetch_bucket_size", c.zero.prefetch_bucket_size, "5e7", 0,
                   "Stage 3: parameter elements gathered ahead of use along the recorded order. \"auto\": "
                   "int(0.9 x hidden_size^2)."),
      ALIAS("zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"),
      KEY_INT_AUTO("zero_optimization.stage3_param_persistence_threshold", c.zero.param_persistence_threshold, "1e5", 0,
                   "Stage 3: parameters with fewer elements stay gathered for the whole run. \"auto\": "
                   "10 x hidden_size."),
      ALIAS("zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold"),
      KEY_INT("zero_optimization.stage3_model_persistence_threshold", c.zero.model_persistence_threshold,
              "9223372036854775807", 0,
              "Stage 3: upper bound on the elements kept gathered by the persistence threshold."),
      ALIAS("zero_optimization.model_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold"),
      KEY_INT("zero_optimization.stage3_max_live_parameters", c.zero.max_live_parameters, "1e9", 0,
              "Stage 3: most gathered parameter elements per rank before units are released."),
      ALIAS("zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"),
      KEY_INT("zero_optimization.stage3_max_reuse_distance", c.zero.max_reuse_distance, "1e9", 0,
              "Stage 3: a unit used again within this many parameter elements is not released."),
      ALIAS("zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance"),
      {.path = "zero_optimization.stage3_gather_16bit_weights_on_model_save",
       .type = "boolean or \"auto\"",
       .default_json = "false",
       .doc = "Stage 3: gather the full 16-bit weights when the model is saved (save_16bit_model refuses to "
              "run at stage 3 without it). \"auto\" (Accelerate's templates): the program's value "
              "(--save-16bit-model), else false, Accelerate's default.",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             if (v.is_auto()) {
               // The canonical name, also when the file uses an alias: resolve() looks for it.
               ctx.mark_auto("zero_optimization.stage3_gather_16bit_weights_on_model_save");
               ctx.config.zero.gather_16bit_weights_on_model_save = false;
             } else {
               ctx.config.zero.gather_16bit_weights_on_model_save = v.as_bool();
             }
           },
       .emit = [](const Config& c) -> Emitted {
         if (pending_auto(c, "zero_optimization.stage3_gather_16bit_weights_on_model_save")) return J("auto");
         return J(c.zero.gather_16bit_weights_on_model_save);
       }},
      ALIAS("zero_optimization.gather_16bit_weights_on_model_save",
            "zero_optimization.stage3_gather_16bit_weights_on_model_save"),
      DEPRECATED("zero_optimization.stage3_gather_fp16_weights_on_model_save",
                 "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                 "Old name of stage3_gather_16bit_weights_on_model_save."),
      IGNORED("zero_optimization.stage3_module_granularity_threshold", "integer", "0", not_default,
              "DeepSpeed groups small PyTorch modules; zero3's program declares its units."),
      ALIAS("zero_optimization.module_granularity_threshold", "zero_optimization.stage3_module_granularity_threshold"),
      IGNORED("zero_optimization.stage3_use_all_reduce_for_fetch_params", "boolean", "false", not_default,
              "Fetching parameters with all-reduce instead of all-gather; zero3 all-gathers (same values)."),
      ALIAS("zero_optimization.use_all_reduce_for_fetch_params",
            "zero_optimization.stage3_use_all_reduce_for_fetch_params"),
      IGNORED("zero_optimization.stage3_allgather_sequential", "boolean", "false", not_default,
              "Per-parameter all-gathers; zero3 gathers each unit's flat buffer at once (same values)."),
      ALIAS("zero_optimization.allgather_sequential", "zero_optimization.stage3_allgather_sequential"),
      KEY_BOOL("zero_optimization.ignore_unused_parameters", c.zero.ignore_unused_parameters, "true",
               "A parameter that received no gradient is not an error."),
      IGNORED("zero_optimization.legacy_stage1", "boolean", "false", not_default,
              "DeepSpeed's old stage 1 implementation; same values."),
      KEY_BOOL("zero_optimization.round_robin_gradients", c.zero.round_robin_gradients, "false",
               "Read; no effect: gradients of CPU runs are already in host memory."),
      IGNORED("zero_optimization.grad_hooks", "boolean", "true", not_default,
              "Old stage 1 switch; zero3 reduces gradients as their unit's backward ends."),
      KEY_INT("zero_optimization.zero_hpz_partition_size", c.zero.hpz_partition_size, "1", 0,
              "ZeRO++ hpZ (stage 3): groups of this many consecutive ranks (usually the ranks per node) keep a "
              "secondary partition of the 16-bit weights. The first all-gather of a unit after each optimizer step "
              "reads the primary partition over every rank and keeps this rank's 1/N of the unit; every later "
              "gather until the next step (backward, and the forward of later micro-steps) reads the secondary "
              "copies within the group. 0 or 1: off; above the world size: the world (no effect, as DeepSpeed's "
              "min). Must divide the world size, and divide or be a multiple of the ranks per node (from the "
              "launcher, docs/launch.md). Not with mics_shard_size. With offload_param (cpu or nvme) the first gather "
              "after each step reads the primary slices from host memory or the NVMe swap and fills the secondary "
              "partition, which stays on the GPU unless zero3.hpz_secondary_memory is \"host\" (DeepSpeed keeps it "
              "on the offload device: \"DeepSpeed's limits\" above). docs/architecture.md has the data flow and "
              "bytes."),
      KEY_BOOL("zero_optimization.zero_quantized_weights", c.zero.quantized_weights, "false",
               "ZeRO++ qwZ (stage 3, bf16 or fp16 compute): every all-gather of a non-persistent unit, from the "
               "primary partition or hpZ's secondary one, sends the slices as int8 codes with one fp32 scale per "
               "zero3.qwz_block_size elements and dequantizes them into the unit's 16-bit buffer (about half the "
               "bytes); persistent units are gathered unquantized, as DeepSpeed's. The optimizer's fp32 master "
               "never sees quantized values. Under MiCS too (DeepSpeed drops it there: \"DeepSpeed's limits\" "
               "above). docs/quantization.md has the data flow and error bound."),
      REFUSED("zero_optimization.zero_quantized_nontrainable_weights", "boolean", "false", not_default,
              "Quantized storage of frozen weights changes their values."),
      KEY_BOOL("zero_optimization.zero_quantized_gradients", c.zero.quantized_gradients, "false",
               "ZeRO++ qgZ (stage 3, bf16 or fp16 compute): the gradient reduce-scatter becomes a two-stage "
               "all-to-all of int4 codes with one fp32 scale per zero3.qgz_block_size elements, within each node "
               "first and then across the nodes, each stage summing the dequantized parts in fp32 and quantizing "
               "again; the result is added into the fp32 gradient accumulator. Under MiCS within the shard group "
               "(DeepSpeed drops it there: \"DeepSpeed's limits\" above); the replica all-reduce stays unquantized. "
               "docs/quantization.md has the data flow and error bound."),
      REFUSED("zero_optimization.zeropp_loco_param", "object", "null", present,
              "LoCo's error feedback for quantized gradients is not implemented."),
      KEY_INT("zero_optimization.mics_shard_size", c.zero.mics_shard_size, "-1", -1,
              "MiCS (stage 3): parameters, gradients and optimizer state are sharded within groups of this many "
              "consecutive ranks and replicated across the groups; gradients are reduce-scattered within the group "
              "every micro-step and all-reduced across the groups once per optimizer step. The ranks per node "
              "gives PyTorch FSDP2's HSDP. -1 or 0: off (shard over every rank). Must divide the world size, and "
              "divide or be a multiple of the ranks per node (from the launcher, docs/launch.md). Checkpoints are "
              "written by the first shard group. With offload_optimizer (cpu, nvme) the slices are all-reduced "
              "across the groups on the device before they go to the optimizer: the same bits as without offload "
              "(DeepSpeed refuses this: \"DeepSpeed's limits\" above). docs/architecture.md has the data flow and "
              "bytes."),
      KEY_BOOL("zero_optimization.mics_hierarchical_params_gather", c.zero.mics_hierarchical_params_gather, "false",
               "MiCS: all-gather a shard group that spans several nodes in two steps, first between the nodes "
               "(ranks with the same local rank) and then within each node, as DeepSpeed's hierarchical gather. "
               "Needs mics_shard_size a multiple of the ranks per node, at least two nodes' worth."),
      IGNORED("zero_optimization.memory_efficient_linear", "boolean", "true", not_default,
              "A PyTorch autograd detail of DeepSpeed's stage 3."),
      IGNORED("zero_optimization.pipeline_loading_checkpoint", "boolean", "false", not_default,
              "Pipeline-parallel checkpoint loading; zero3's pipelined checkpoints load by unit names at any stage "
              "count (docs/checkpoints.md)."),
      IGNORED("zero_optimization.override_module_apply", "boolean", "true", not_default, "A PyTorch nn.Module detail."),
      IGNORED("zero_optimization.log_trace_cache_warnings", "boolean", "false", not_default,
              "DeepSpeed's trace cache; zero3 reports schedule changes itself."),
      IGNORED("zero_optimization.enable_sanity_checks", "boolean", "false", not_default,
              "DeepSpeed's internal checks; zero3's checks are always on."),
      IGNORED("zero_optimization.save_muon_momentum_buffer_in_memory", "boolean", "false", not_default,
              "Muon is not supported."),
      IGNORED("zero_optimization.leaf_module", "object", "", present,
              "Marks PyTorch modules as ZeRO-3 leaves; zero3's program declares its units."),
      DEPRECATED("allgather_size", "zero_optimization.allgather_bucket_size",
                 "Old top-level form of allgather_bucket_size, used with \"zero_optimization\": true."),

      // ----- asynchronous I/O (NVMe offload) -----
      SECTION("aio", "The asynchronous I/O engine behind NVMe offload (io_uring, libaio or pread/pwrite)."),
      KEY_INT("aio.block_size", c.aio.block_size, "1048576", 1, "Bytes per I/O request."),
      KEY_INT("aio.queue_depth", c.aio.queue_depth, "8", 1, "Requests in flight per thread."),
      KEY_INT("aio.intra_op_parallelism", c.aio.intra_op_parallelism, "1", 1, "Threads that split each read or write."),
      DEPRECATED("aio.thread_count", "aio.intra_op_parallelism",
                 "Old name of intra_op_parallelism (DeepSpeed now ignores it without a word; zero3 uses it)."),
      KEY_BOOL("aio.single_submit", c.aio.single_submit, "false", "Submit requests one at a time."),
      KEY_BOOL("aio.overlap_events", c.aio.overlap_events, "true", "Submit new requests while others complete."),
      {.path = "aio.use_gds",
       .type = "boolean",
       .default_json = "false",
       .status = S::ignored,
       .doc = "GPUDirect Storage is not implemented; zero3 stages through pinned host buffers (same values).",
       .when = When::not_default,
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.aio.use_gds = v.as_bool(); }},

      // ----- checkpoints -----
      SECTION("checkpoint", "Checkpoint options."),
      {.path = "checkpoint.tag_validation",
       .type = "string",
       .default_json = "\"Warn\"",
       .doc = "Check that all ranks save under the same tag: \"Ignore\", \"Warn\" or \"Fail\" (any case).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.checkpoint.tag_validation = v.as_choice({"Ignore", "Warn", "Fail"}, true);
           },
       .emit = [](const Config& c) -> Emitted { return J(c.checkpoint.tag_validation); }},
      REFUSED("checkpoint.load_universal", "boolean", "false", not_default,
              "DeepSpeed's universal checkpoint format is not read; zero3's own checkpoints load on any world "
              "size."),
      KEY_BOOL("checkpoint.use_node_local_storage", c.checkpoint.use_node_local_storage, "false",
               "Each node's checkpoint directory is local to it: it holds its own ranks' files (load with the "
               "same ranks per node)."),
      SECTION("checkpoint.parallel_write", "Pipeline-parallel checkpoint writing."),
      IGNORED("checkpoint.parallel_write.pipeline_stage", "boolean", "false", not_default,
              "Every rank writes its own shard, a pipeline's stages side by side (docs/checkpoints.md)."),
      IGNORED("checkpoint.checkpoint_serialization", "boolean", "true", not_default,
              "torch.save serialization detail; zero3 writes safetensors-style files."),
      IGNORED("checkpoint.writer", "object", "null", present, "DeepSpeed's fast checkpoint writer options."),

      // ----- data types -----
      SECTION("data_types", "Data types of internal buffers."),
      {.path = "data_types.grad_accum_dtype",
       .type = "string",
       .default_json = "null",
       .doc = "Data type of gradient accumulation: \"fp32\", \"fp16\" or \"bf16\". null: fp32.",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.grad_accum_dtype = v.as_dtype(); },
       .emit = [](const Config& c) -> Emitted { return optional_dtype(c.grad_accum_dtype); }},
      REFUSED("data_types.param_dtype", "string", "null", present,
              "The compute type comes from the bf16/fp16 sections and master weights are fp32; use those."),
      REFUSED("data_types.buffer_dtype", "string", "null", present,
              "PyTorch module buffers; zero3's model has no separate buffers to cast."),

      // ----- monitors -----
      SECTION("tensorboard",
              "TensorBoard event files of the steps_per_print figures, written by the training program "
              "(llama3_train) as DeepSpeed's monitor writes them."),
      KEY_BOOL("tensorboard.enabled", c.tensorboard.enabled, "false",
               "Write event files (events.out.tfevents.*) with the Train/Samples/* scalars."),
      KEY_STRING("tensorboard.output_path", c.tensorboard.output_path, "\"\"", "Directory of the event files."),
      KEY_STRING("tensorboard.job_name", c.tensorboard.job_name, "\"DeepSpeedJobName\"",
                 "Subdirectory under output_path."),
      SECTION("csv_monitor",
              "CSV files of the steps_per_print figures, written by the training program (llama3_train)."),
      KEY_BOOL("csv_monitor.enabled", c.csv_monitor.enabled, "false", "Write CSV files."),
      KEY_STRING("csv_monitor.output_path", c.csv_monitor.output_path, "\"\"", "Directory of the CSV files."),
      KEY_STRING("csv_monitor.job_name", c.csv_monitor.job_name, "\"DeepSpeedJobName\"",
                 "Subdirectory under output_path."),
      IGNORED("wandb", "object", "", enabled, "Weights & Biases needs its Python client; use csv_monitor."),
      IGNORED("comet", "object", "", enabled, "Comet needs its Python client; use csv_monitor."),

      // ----- DeepSpeed features outside ZeRO -----
      IGNORED("flops_profiler", "object", "", enabled, "DeepSpeed's PyTorch module profiler (no effect on training)."),
      IGNORED("autotuning", "object", "", enabled, "Runs only under DeepSpeed's launcher with --autotuning."),
      IGNORED("activation_checkpointing", "object", "", present,
              "Configures DeepSpeed's Python checkpointing API; in zero3 recomputing activations is the "
              "training program's choice (the Llama example has an option for it), with the same values."),
      IGNORED("comms_logger", "object", "", enabled, "DeepSpeed's communication log; use ZERO3_LOG_LEVEL=debug."),
      IGNORED("timers", "object", "", present, "DeepSpeed's throughput timers; see wall_clock_breakdown."),
      IGNORED("eigenvalue", "object", "", enabled, "Hessian eigenvalue estimates for quantization; no effect here."),
      IGNORED("compile", "object", "", present, "torch.compile / DeepCompile; zero3 is compiled C++ already."),
      SECTION("pipeline",
              "Pipeline parallelism (docs/pipeline.md). DeepSpeed reads this section as a dict whose keys mostly "
              "mirror PipelineModule's constructor arguments; zero3 reads them as the pipeline's settings: a config "
              "with more than one stage runs on a zero3::PipelineEngine."),
      {.path = "pipeline.stages",
       .type = "integer or \"auto\"",
       .default_json = "\"auto\"",
       .doc = "Pipeline stages; the world size over it is the data-parallel size each stage's ZeRO runs over, and "
              "it must divide the world size. \"auto\" (DeepSpeed's default, also when absent): the program's value "
              "(ResolveInputs::pipeline_stages), else 1 (no pipeline).",
       .auto_ok = true,
       .apply =
           [](ReadContext& ctx, const Value& v) {
             set_or_auto(ctx, v, ctx.config.pipeline.stages, v.is_auto() ? int64_t{0} : v.as_int(1));
           },
       // Unset means "auto" whether or not the file said so.
       .emit = [](const Config& c) -> Emitted { return c.pipeline.stages ? J(*c.pipeline.stages) : J("auto"); }},
      {.path = "pipeline.partition",
       .type = "string",
       .default_json = "\"parameters\"",
       .doc = "How layers are cut into stages (PipelineModule's partition_method): \"parameters\" balances "
              "parameter counts, \"uniform\" layer counts, \"type:REGEX\" the layers whose name matches REGEX "
              "(case-insensitive). DeepSpeed's config default \"best\" is read as \"parameters\" (PipelineModule's "
              "own default) with a warning; \"profile\" is refused (DeepSpeed does not implement it either).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             std::string p = v.as_string();
             if (p == "best") {
               ctx.warn(std::string(v.path()) +
                        ": \"best\" is DeepSpeed's config default, which its PipelineModule does not read; zero3 "
                        "partitions by \"parameters\", PipelineModule's own default");
               p = "parameters";
             }
             if (p == "profile")
               v.fail_with("\"profile\" is not implemented (DeepSpeed's PipelineModule refuses it too)");
             if (p != "parameters" && p != "uniform") {
               if (p.rfind("type:", 0) != 0 || p.size() == 5) {
                 v.fail("\"parameters\", \"uniform\" or \"type:REGEX\" with a regular expression after the colon");
               }
               check_partition_regex(v, p.substr(5));
             }
             ctx.config.pipeline.partition = p;
           },
       .emit = [](const Config& c) -> Emitted { return J(c.pipeline.partition); }},
      KEY_INT("pipeline.activation_checkpoint_interval", c.pipeline.activation_checkpoint_interval, "0", 0,
              "Recompute the activations of every this many layers of a stage in its backward (0: keep them); "
              "passed to the program's stages (PipelineStageInfo), which run the layers and apply it."),
      IGNORED("pipeline.pipe_partitioned", "boolean", "true", not_default,
              "DeepSpeed splits the activations sent between stages over the tensor-parallel ranks; zero3 has no "
              "tensor parallelism, so whole activations move, as DeepSpeed moves them without it."),
      IGNORED("pipeline.grad_partitioned", "boolean", "true", not_default,
              "DeepSpeed splits the gradients sent between stages over the tensor-parallel ranks; zero3 has no "
              "tensor parallelism, so whole gradients move, as DeepSpeed moves them without it."),
      IGNORED("pipeline.seed_layers", "boolean", "false", not_default,
              "DeepSpeed seeds each layer's initialisation; zero3's is keyed by parameter name, so every stage "
              "split starts from the same bits already."),
      REFUSED("progressive_layer_drop", "object", "", enabled, "Skipping layers during training changes the model."),
      REFUSED("curriculum_learning", "object", "", enabled, "Curriculum learning changes the data each step sees."),
      REFUSED("data_efficiency", "object", "", enabled,
              "Data sampling and routing change the data each step sees; zero3 does not implement them."),
      REFUSED("compression_training", "object", "", present,
              "Quantization, pruning and layer reduction change the model."),
      REFUSED("quantize_training", "object", "", enabled, "Quantization-aware training changes the model."),
      REFUSED("sparse_attention", "object", "", present, "Sparse attention changes the model."),
      REFUSED("weight_quantization", "object", "", present, "Quantized weights change the model."),
      REFUSED("elasticity", "object", "", enabled,
              "Elastic training rewrites the batch sizes; give train_batch_size and friends yourself."),
      REFUSED("hybrid_engine", "object", "", enabled, "DeepSpeed-Chat's inference engine is not implemented."),
      REFUSED("tensor_parallel", "object", "", above_one,
              "Tensor parallelism (autotp_size > 1) is not implemented; zero3 is data parallel with ZeRO."),
      REFUSED("expert_parallel", "object", "", enabled, "Expert parallelism is not implemented."),
      REFUSED("nebula", "object", "", enabled, "Azure Nebula checkpoint service; zero3 writes its own checkpoints."),
      REFUSED("datastates_ckpt", "object", "", present,
              "DataStates asynchronous checkpointing; zero3 writes its own checkpoints."),

      // ----- zero3's own section -----
      SECTION("zero3",
              "zero3's own settings, for what DeepSpeed has no key for. DeepSpeed ignores this section. "
              "zero3::initialize() applies it; connect() alone does not (docs/launch.md)."),
      {.path = "zero3.device",
       .type = "string",
       .default_json = "\"auto\"",
       .doc = "\"cuda\", \"cpu\" or \"auto\" (cuda when a GPU is present and CUDA was compiled in).",
       .auto_ok = true,  // "auto" is one of its values
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.device = v.as_choice({"auto", "cpu", "cuda"});
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.device); }},
      {.path = "zero3.comm_backend",
       .type = "string",
       .default_json = "\"auto\"",
       .doc = "\"nccl\", \"gloo\" or \"auto\" (nccl with device cuda; on cpu gloo, or local for a single "
              "process).",
       .auto_ok = true,  // "auto" is one of its values
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.comm_backend = v.as_choice({"auto", "gloo", "nccl"});
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.comm_backend); }},
      {.path = "zero3.network",
       .type = "string",
       .default_json = "\"auto\"",
       .doc = "Network between nodes: \"efa\" requires AWS EFA (libfabric's efa provider) and fails without it "
              "instead of falling back to TCP; \"socket\" uses TCP; \"auto\" uses EFA when found and says so.",
       .auto_ok = true,  // "auto" is one of its values
       .apply =
           [](ReadContext& ctx, const Value& v) {
             std::string n = v.as_choice({"auto", "efa", "socket"});
             ctx.config.zero3.network = n == "efa"      ? NetworkTransport::efa
                                        : n == "socket" ? NetworkTransport::socket
                                                        : NetworkTransport::auto_detect;
           },
       .emit = [](const Config& c) -> Emitted { return J(network_name(c.zero3.network)); }},
      KEY_INT("zero3.comm_timeout_s", c.zero3.comm_timeout_s, "600", 1,
              "Seconds before a collective or store operation fails with a report of who is missing "
              "(ZERO3_COMM_TIMEOUT_S overrides it)."),
      {.path = "zero3.seed",
       .type = "integer",
       .default_json = "1234",
       .doc = "Seed of the parameter initialisation RNG (same bits on any world size and device).",
       .apply = [](ReadContext& ctx, const Value& v) { ctx.config.zero3.seed = static_cast<uint64_t>(v.as_int(0)); },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.seed); }},
      KEY_BOOL("zero3.check_schedule_every_step", c.zero3.check_schedule_every_step, "false",
               "Compare each scope entry across ranks before anything is issued for it, in every micro-step "
               "(normally in the first only); every micro-step is compared as a whole at step() regardless."),
      KEY_BOOL("zero3.nccl_register_buffers", c.zero3.nccl_register_buffers, "false",
               "Read; no effect yet: the engine does not register its buffers with NCCL."),
      KEY_INT("zero3.qwz_block_size", c.zero3.qwz_block_size, "2048", 1,
              "qwZ: elements per fp32 scale in the int8 weight messages, counted from each slice's start (the last "
              "block may be partial). DeepSpeed has no key for it and picks about 8000 elements per group per "
              "tensor. Scales cost 4 bytes per block: 0.2% of the codes at 2048."),
      KEY_INT("zero3.qgz_block_size", c.zero3.qgz_block_size, "2048", 1,
              "qgZ: elements per fp32 scale in the int4 gradient messages; must be even (two int4 codes share a "
              "byte, and a block fills whole bytes). Scales cost 4 bytes per block: 0.4% of the codes at 2048."),
      {.path = "zero3.hpz_secondary_memory",
       .type = "string",
       .default_json = "\"device\"",
       .doc = "Where hpZ's secondary partition (zero_hpz_partition_size) lives on a GPU: \"device\" (its gathers "
              "read device memory) or \"host\" (pinned host memory, copied up before each gather from it: for "
              "runs whose device memory cannot hold it, typically with offload_param; `zero3 plan --advise` says "
              "which fits). On the cpu device both are host memory.",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.hpz_secondary_on_host = v.as_choice({"device", "host"}) == "host";
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.hpz_secondary_on_host ? "host" : "device"); }},
      {.path = "zero3.pipeline_schedule",
       .type = "string",
       .default_json = "\"1f1b\"",
       .doc = "The pipeline's schedule (DeepSpeed has no key; its engine runs 1F1B): \"gpipe\" (every forward, then "
              "every backward), \"1f1b\" (at least pipeline.stages micro-batches) or \"interleaved_1f1b\" "
              "(zero3.pipeline_virtual_stages >= 2 stages per rank, micro-batches a multiple of pipeline.stages).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.pipeline_schedule = v.as_choice({"gpipe", "1f1b", "interleaved_1f1b"});
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.pipeline_schedule); }},
      KEY_INT("zero3.pipeline_virtual_stages", c.zero3.pipeline_virtual_stages, "1", 1,
              "Stages per pipeline rank (Megatron-LM's virtual pipeline size): 1 for gpipe and 1f1b, 2 or more for "
              "interleaved_1f1b; the model is cut into pipeline.stages x this many stages."),
      {.path = "zero3.pipeline_stage_order",
       .type = "string",
       .default_json = "\"stages_across_nodes\"",
       .doc = "Which ranks share a stage: \"stages_across_nodes\" (a stage's ranks are consecutive, so with one "
              "node's ranks per stage ZeRO stays within a node and only activations cross between nodes; "
              "DeepSpeed's grid order) or \"stages_within_node\" (a data-parallel index's stages are consecutive).",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.pipeline_stage_order = v.as_choice({"stages_across_nodes", "stages_within_node"});
           },
       .emit = [](const Config& c) -> Emitted { return J(c.zero3.pipeline_stage_order); }},
      {.path = "zero3.pipeline_gradient_reduction",
       .type = "string",
       .default_json = "\"micro_batch\"",
       .doc = "ZeRO stage 2-3 inside a pipeline stage: \"micro_batch\" reduce-scatters each micro-batch's gradients "
              "as its backward ends (only the rank's slices are kept, as DeepSpeed's ZeRO-2/3 with gradient "
              "accumulation) or \"step\" accumulates the stage's full fp32 gradients over the step's micro-batches "
              "and reduce-scatters them once at its end (the gradient memory of ZeRO-1 during the step, one reduction "
              "instead of one per micro-batch: FSDP2's under PyTorch's pipelining schedules). Stage 0-1 reduce once "
              "per step either way.",
       .apply =
           [](ReadContext& ctx, const Value& v) {
             ctx.config.zero3.pipeline_reduce_once_per_step = v.as_choice({"micro_batch", "step"}) == "step";
           },
       .emit = [](const Config& c) -> Emitted {
         return J(c.zero3.pipeline_reduce_once_per_step ? "step" : "micro_batch");
       }},
  };
}

}  // namespace

const std::vector<KeyEntry>& key_table() {
  static const std::vector<KeyEntry> table = build_table();
  return table;
}

const KeyEntry* find_key(std::string_view path) {
  for (const KeyEntry& e : key_table()) {
    if (e.path == path) return &e;
  }
  return nullptr;
}

std::string_view leaf_name(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

std::string_view parent_of(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view{} : path.substr(0, dot);
}

std::vector<const KeyEntry*> children_of(std::string_view section) {
  std::vector<const KeyEntry*> out;
  for (const KeyEntry& e : key_table()) {
    if (parent_of(e.path) == section) out.push_back(&e);
  }
  return out;
}

std::string_view scheduler_type_name(SchedulerType type) {
  switch (type) {
    case SchedulerType::none:
      return "";
    case SchedulerType::warmup_lr:
      return "WarmupLR";
    case SchedulerType::warmup_decay_lr:
      return "WarmupDecayLR";
    case SchedulerType::warmup_cosine_lr:
      return "WarmupCosineLR";
    case SchedulerType::one_cycle:
      return "OneCycle";
  }
  return "";
}

}  // namespace zero3::config_detail

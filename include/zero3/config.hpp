// The training configuration: a DeepSpeed JSON file (ds_config.json) read into typed structs.
//
// One struct per JSON section, with DeepSpeed's defaults in the struct (DeepSpeed 0.18's, the version the
// seed configs ran with; 0.19 changed gradient_clipping to 1.0 and offload pin_memory to true).
// `load_config` reads a file that DeepSpeed accepts, unchanged: integers written as 5e8, "auto", the
// stage3_* aliases, deprecated keys, //, /* */ and # comments, trailing commas. What it cannot use it
// rejects before any work starts, with a ConfigError whose message begins with the key path
// ("zero_optimization.offload_param.device: ...").
// docs/config.md lists every key with what zero3 does with it.
//
// "auto" values are resolved by `resolve()` from facts only the training program knows (world size,
// hidden size, batch sizes, precision); an "auto" that nothing can resolve is an error naming the value to
// pass. Until resolved, an auto field holds std::nullopt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero3/dtype.hpp"

namespace zero3 {

enum class OffloadDevice { none, cpu, nvme };

// zero_optimization.offload_param / offload_optimizer
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;  // required for nvme
  bool pin_memory = false;
  int64_t buffer_count = 5;            // offload_param: 5; offload_optimizer: 4
  int64_t buffer_size = 100'000'000;   // elements per buffer (offload_param)
  int64_t max_in_cpu = 1'000'000'000;  // elements kept in CPU memory before going to nvme (offload_param)
  bool pipeline_read = false;          // offload_optimizer
  bool pipeline_write = false;         // offload_optimizer
  double ratio = 1.0;                  // offload_optimizer: fraction of the optimizer step run on CPU
  bool fast_init = false;              // offload_optimizer
};

inline OffloadConfig offload_defaults(int64_t buffer_count) {
  OffloadConfig o;
  o.buffer_count = buffer_count;
  return o;
}

// zero_optimization
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // DeepSpeed turns it on for stage 3 when unset; see `overlap_comm_set`
  bool overlap_comm_set = false;
  bool reduce_scatter = true;
  std::optional<int64_t> reduce_bucket_size = 500'000'000;  // elements; nullopt while "auto"
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1'000'000'000;                        // elements per optimizer step tile
  std::optional<int64_t> prefetch_bucket_size = 50'000'000;      // stage3_prefetch_bucket_size
  std::optional<int64_t> param_persistence_threshold = 100'000;  // stage3_param_persistence_threshold
  int64_t model_persistence_threshold = INT64_MAX;               // stage3_model_persistence_threshold
  int64_t max_live_parameters = 1'000'000'000;                   // stage3_max_live_parameters
  int64_t max_reuse_distance = 1'000'000'000;                    // stage3_max_reuse_distance
  bool gather_16bit_weights_on_model_save = false;               // stage3_gather_16bit_weights_on_model_save
  bool ignore_unused_parameters = true;
  bool load_from_fp32_weights = true;
  // Layouts for slow links between nodes (stage 3; docs/architecture.md, "Process groups and layouts").
  int64_t hpz_partition_size = 1;  // zero_hpz_partition_size: ZeRO++ hpZ group; <= 1: off
  int64_t mics_shard_size = -1;    // MiCS shard group; <= 0: off (shard over every rank)
  bool mics_hierarchical_params_gather = false;
  // ZeRO++ quantized collectives (stage 3, 16-bit compute; docs/quantization.md).
  bool quantized_weights = false;    // zero_quantized_weights (qwZ): int8 parameter all-gathers
  bool quantized_gradients = false;  // zero_quantized_gradients (qgZ): int4 all-to-all gradient reduction
  OffloadConfig offload_param = offload_defaults(5);
  OffloadConfig offload_optimizer = offload_defaults(4);
};

// aio: the asynchronous I/O engine behind NVMe offload.
struct AioConfig {
  int64_t block_size = 1'048'576;  // bytes
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct Fp16Config {
  bool enabled = false;
  bool auto_enabled = false;   // "enabled": "auto": follows the program's precision
  bool section_given = false;  // the file has an fp16 section (without one, an fp16 program enables it)
  double loss_scale = 0;       // 0: dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

struct Bf16Config {
  bool enabled = false;
  bool auto_enabled = false;
  bool section_given = false;  // the file has a bf16 section (without one, a bf16 program enables it)
  bool immediate_grad_update = false;
  bool check_grad_overflow = false;  // skip the optimizer step when a gradient holds Inf/NaN
};

enum class OptimizerType { adam, adamw };

struct OptimizerConfig {
  bool present = false;  // an "optimizer" section was given
  OptimizerType type = OptimizerType::adamw;
  std::optional<double> lr = 1e-3;  // nullopt while "auto"
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  std::optional<double> weight_decay = 0.0;
  // Adam with weight_decay: DeepSpeed's "Adam" is AdamW (decoupled) unless adam_w_mode is false.
  bool adam_w_mode = true;
  bool bias_correction = true;
};

enum class SchedulerType { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle };

struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr = 0.001;
  std::optional<int64_t> warmup_num_steps = 1000;
  std::string warmup_type = "log";         // "log" or "linear"
  std::optional<int64_t> total_num_steps;  // WarmupDecayLR, WarmupCosineLR
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle
  double cycle_min_lr = 0, cycle_max_lr = 0;
  double decay_lr_rate = 0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;
  int64_t cycle_first_stair_count = 0, cycle_second_stair_count = 0;
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0;
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";  // Ignore | Warn | Fail
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;
};

struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct TensorboardConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

enum class NetworkTransport { auto_detect, efa, socket };

// The "pipeline" section. DeepSpeed reads it as a dict (runtime/config.py get_pipeline_config) whose keys mostly
// mirror PipelineModule's constructor arguments; zero3 reads it as the pipeline's own settings (docs/pipeline.md).
struct PipelineConfig {
  std::optional<int64_t> stages;         // nullopt while "auto" or absent: resolve() makes it the program's, else 1
  std::string partition = "parameters";  // parameters | uniform | type:REGEX (PipelineModule's partition_method)
  int64_t activation_checkpoint_interval = 0;
};

// The "zero3" section: what DeepSpeed has no key for.
struct Zero3Section {
  std::string device = "auto";                               // auto | cpu | cuda
  std::string comm_backend = "auto";                         // auto | gloo | nccl
  NetworkTransport network = NetworkTransport::auto_detect;  // "efa" requires EFA and fails without it
  int64_t comm_timeout_s = 600;                              // every collective and store operation
  uint64_t seed = 1234;                                      // meta-init RNG seed
  bool check_schedule_every_step = false;                    // debug: compare each scope entry across ranks
  bool nccl_register_buffers = false;
  int64_t qwz_block_size = 2048;  // elements per fp32 scale of qwZ's int8 messages
  int64_t qgz_block_size = 2048;  // elements per fp32 scale of qgZ's int4 messages (even)
  bool hpz_secondary_on_host = false;  // hpz_secondary_memory "host": hpZ's secondary partition in pinned host memory
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved_1f1b (zero3/pipeline_schedule.hpp)
  int64_t pipeline_virtual_stages = 1;     // stages per pipeline rank; interleaved_1f1b needs 2 or more
  std::string pipeline_stage_order = "stages_across_nodes";  // or stages_within_node
  // ZeRO 2-3 inside a pipeline stage: reduce-scatter each micro-batch's gradients (false: the slices only, DeepSpeed's
  // ZeRO-2/3 with accumulation) or accumulate the stage's full gradients over the step and reduce-scatter them once
  // (true, "step": FSDP2's no gradient sync until the last micro-batch under PyTorch's pipelining schedules).
  bool pipeline_reduce_once_per_step = false;
};

struct Config {
  // Batch triple: train_batch_size = micro * grad_accum * data-parallel size (the world size over pipeline.stages).
  // nullopt while "auto" or absent.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping = 0.0;  // 0: off; nullopt while "auto"
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<DType> communication_data_type;  // default: communication_dtype()
  std::optional<DType> grad_accum_dtype;         // data_types.grad_accum_dtype; default f32
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool dump_state = false;

  ZeroConfig zero;
  AioConfig aio;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  CheckpointConfig checkpoint;
  CsvMonitorConfig csv_monitor;
  TensorboardConfig tensorboard;
  PipelineConfig pipeline;
  Zero3Section zero3;

  std::vector<std::string> warnings;  // what load/resolve accepted but wants the user to know
  // Key paths the file gave as "auto" (or left to follow another value), in table order. resolve() fills
  // their fields; the list stays as a record of what was resolved.
  std::vector<std::string> auto_keys;
  bool resolved = false;  // set by resolve()
  std::string source;     // the file it was read from ("<config>" for text), named in error messages

  // The compute dtype the config selects: bf16, f16 or f32.
  DType compute_dtype() const { return bf16.enabled ? DType::bf16 : fp16.enabled ? DType::f16 : DType::f32; }
  // The dtype gradients are reduced in: communication_data_type, else DeepSpeed's default, the compute dtype (bf16
  // under bf16, fp16 under fp16, fp32 otherwise: DeepSpeedEngine.communication_data_type).
  DType communication_dtype() const { return communication_data_type.value_or(compute_dtype()); }
};

// Facts from the training program that resolve "auto". Unset fields resolve nothing.
struct ResolveInputs {
  std::optional<int64_t> world_size;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> micro_batch;
  std::optional<int64_t> grad_accum;
  std::optional<DType> precision;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<int64_t> total_steps;
  std::optional<int64_t> warmup_steps;
  std::optional<double> max_grad_norm;  // gradient_clipping "auto"; Hugging Face's default is 1.0
  std::optional<double> adam_beta1, adam_beta2, adam_epsilon;  // betas/eps "auto"; default 0.9, 0.999, 1e-8
  // stage3_gather_16bit_weights_on_model_save "auto"; default false (Accelerate's zero3_save_16bit_model)
  std::optional<bool> save_16bit_model;
  std::optional<int64_t> pipeline_stages;  // pipeline.stages "auto" (or absent); default 1: no pipeline
};

// Parses DeepSpeed JSON text. `source` names the file in error messages. Throws ConfigError, never
// crashes: arrays and objects nest at most 256 levels deep, a number must fit in a double, and values
// quoted in messages are cut to 80 characters. Each warning
// (deprecated names, ignored keys, unknown top-level keys) goes into Config::warnings and is logged once
// at warn level on rank 0. Runs the cross-key checks that need no program facts.
Config parse_config(const std::string& json_text, const std::string& source = "<config>");

// The most bytes load_config reads by default: a DeepSpeed config is a few KiB.
inline constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

// Reads and parses a file. Throws ConfigError naming the file: unreadable, a directory, larger than
// `max_bytes`, or (a pipe, FIFO or device) no end of input within 5 s. Reading never waits longer and
// never holds more than max_bytes + 64 KiB, so /dev/zero or a FIFO without a writer cannot hang it.
Config load_config(const std::string& path, uint64_t max_bytes = kMaxConfigBytes);

// Resolves "auto" and the batch triple, then runs the cross-field checks. Throws ConfigError naming the
// key and the value to pass when something stays unresolved or inconsistent. An unset world_size counts
// as 1. A value the program passes that contradicts an explicit config value (micro batch, gradient
// accumulation, precision) is an error, as in Hugging Face's integration; a config with no bf16 (fp16)
// section gets bf16 (fp16) enabled when the program's precision is bf16 (fp16), as Accelerate fills it.
// A size computed from the inputs that does not fit in 64 bits is an error naming them. Reads
// ZERO3_SWAP_DIR, which replaces every nvme_path. Logs each resolution at info level.
void resolve(Config& config, const ResolveInputs& inputs);

// Checks that need the machine: nvme_path exists and is writable. Throws ConfigError.
void check_runtime_paths(const Config& config);

// The resolved config as DeepSpeed-shaped JSON text (pretty-printed), as `zero3 config check` prints it:
// every supported key with its value (defaults included; "auto" where still unresolved), under
// DeepSpeed's documented names. parse_config accepts it back.
std::string to_json(const Config& config);

// The reference of every key (docs/config.md) as markdown, generated from the key table the reader uses.
std::string config_reference_markdown();

}  // namespace zero3

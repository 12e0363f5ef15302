// llama3_train: the Llama-3 example's training program. Reads a Hugging Face model config and a DeepSpeed
// config, joins the job through whichever launcher started it, and trains on text or token files with the
// model's units on the zero3 engine (ZeRO stage 0-3). See examples/llama3/README.md and --help.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/eval_batches.hpp"
#include "data/micro_batches.hpp"
#include "data/sampler.hpp"
#include "data/tokenizer.hpp"
#include "engine_model.hpp"
#include "metrics.hpp"
#include "mfu.hpp"
#include "model_config.hpp"
#include "ops/cross_entropy.hpp"
#include "pipeline/layer_partition.hpp"
#include "pipeline_model.hpp"
#include "progress.hpp"
#include "train_options.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"
#include "zero3/initialize.hpp"
#include "zero3/log.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/pipeline_checkpoint.hpp"
#include "zero3/pipeline_engine.hpp"
#include "zero3/pipeline_schedule.hpp"
#include "zero3/safetensors.hpp"
#include "zero3/version.hpp"

#if LLAMA3_HAVE_CUDA
#include "cuda/cuda_model_ops.hpp"
#endif

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace llama3 {
namespace log = zero3::log;
namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- Threads ----------------------------------------------------------------------------------------------

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Several ranks on one machine must share its cores: OpenMP threads = cores / ranks on the node, spinning
// workers put to sleep (OMP_WAIT_POLICY=passive: a tiny-model step on the 2-core build machine went from
// 0.45 s to 30 ms), and OpenBLAS single-threaded (ops/gemm.cpp splits products over OpenMP instead). libgomp
// reads its environment when the library loads, before main(), so when something had to be set the program
// re-executes itself once with it; values the user set are kept.
void setup_threads(char** argv) {
  if (std::getenv("LLAMA3_TRAIN_THREADS_SET") != nullptr) return;
  int local_world = 1;
  try {
    local_world = std::max(1, zero3::detect_launch().local_world_size);
  } catch (const std::exception&) {
    // An inconsistent launcher environment is reported by connect() later, with its variable named.
  }
  const int threads = std::max(1, usable_cores() / local_world);
  bool changed = false;
  auto set_default = [&](const char* name, const std::string& value) {
    if (std::getenv(name) != nullptr) return;
    setenv(name, value.c_str(), 1);
    changed = true;
  };
  set_default("OMP_NUM_THREADS", std::to_string(threads));
  set_default("OMP_WAIT_POLICY", "passive");
  set_default("OPENBLAS_NUM_THREADS", "1");
  setenv("LLAMA3_TRAIN_THREADS_SET", "1", 1);
  if (changed) {
    execv("/proc/self/exe", argv);
    // Still here: exec failed. Go on; the thread count at least can be set through the API.
    std::fprintf(stderr,
                 "llama3_train: re-executing with the OpenMP settings failed; OMP_WAIT_POLICY stays the "
                 "runtime's default\n");
  }
}

// ---- Files ------------------------------------------------------------------------------------------------

fs::path exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : p.parent_path();
}

// A default path such as configs/zero-stage3.json: relative to the working directory, else to the installed
// share/zero3 directory (bin/../share/zero3), else to the source tree the program was built from.
std::string find_default(const std::string& path, bool was_given) {
  if (was_given || fs::path(path).is_absolute() || fs::exists(path)) return path;
  for (const fs::path& base : {exe_dir() / ".." / "share" / "zero3", fs::path(LLAMA3_REPO_DIR)}) {
    fs::path candidate = base / path;
    if (fs::exists(candidate)) return fs::weakly_canonical(candidate).string();
  }
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw zero3::IoError(path + ": cannot read it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- Config -----------------------------------------------------------------------------------------------

std::optional<zero3::DType> precision_dtype(const std::optional<std::string>& p) {
  if (!p) return std::nullopt;
  if (*p == "bf16") return zero3::DType::bf16;
  if (*p == "fp16") return zero3::DType::f16;
  return zero3::DType::f32;
}

const char* precision_name(zero3::DType t) {
  return t == zero3::DType::bf16 ? "bf16" : t == zero3::DType::f16 ? "fp16" : "fp32";
}

// The program's flags applied to the DeepSpeed config before resolve(), and the facts resolve() fills "auto"
// from: what Hugging Face's integration does with a Trainer's arguments.
void apply_flags(zero3::Config& cfg, const TrainOptions& o) {
  if (o.lr && cfg.optimizer.present && cfg.optimizer.lr && *cfg.optimizer.lr != *o.lr) {
    log::warn_rank0(cfg.source, ": optimizer.params.lr ", *cfg.optimizer.lr, " replaced by --lr ", *o.lr);
    cfg.optimizer.lr = *o.lr;
  }
  if (cfg.scheduler.type == zero3::SchedulerType::none && o.warmup_steps) {
    // No scheduler in the config: Hugging Face's default, linear warmup then linear decay to 0.
    cfg.scheduler.type = zero3::SchedulerType::warmup_decay_lr;
    cfg.scheduler.warmup_type = "linear";
    cfg.scheduler.warmup_min_lr = 0.0;
    cfg.scheduler.warmup_max_lr = std::nullopt;  // the resolved lr
    cfg.scheduler.warmup_num_steps = *o.warmup_steps;
    cfg.scheduler.total_num_steps = std::max<int64_t>(o.steps, *o.warmup_steps + 1);
  }
  cfg.zero3.seed = o.seed;
  if (o.pipeline_stages) {
    if (cfg.pipeline.stages && *cfg.pipeline.stages != *o.pipeline_stages) {
      log::warn_rank0(cfg.source, ": pipeline.stages ", *cfg.pipeline.stages, " replaced by --pipeline-stages ",
                      *o.pipeline_stages);
    }
    cfg.pipeline.stages = *o.pipeline_stages;
  }
  if (o.network != "auto") {
    cfg.zero3.network = o.network == "efa" ? zero3::NetworkTransport::efa : zero3::NetworkTransport::socket;
  }
}

zero3::ResolveInputs resolve_inputs(const zero3::Config& cfg, const TrainOptions& o, const ModelConfig& mc) {
  std::optional<zero3::DType> precision = precision_dtype(o.precision);
  if (!precision && (cfg.bf16.auto_enabled || cfg.fp16.auto_enabled)) {
    precision = zero3::DType::f32;  // Hugging Face's default when neither --bf16 nor --fp16 is given
    log::info_rank0(cfg.source, ": bf16/fp16 \"auto\" with no --precision: fp32");
  }
  zero3::ResolveInputs in;
  in.hidden_size = mc.hidden_size;
  in.micro_batch = o.micro_batch;
  in.grad_accum = o.grad_accum;
  in.precision = precision;
  in.lr = o.lr;
  in.total_steps = o.steps;
  in.warmup_steps = o.warmup_steps.value_or(0);
  return in;
}

// ---- Dry run ----------------------------------------------------------------------------------------------

// The most micro-batches each pipeline rank holds between their forward and their backward under `schedule`: a
// stage keeps a runner (its activations) for each.
std::vector<int64_t> in_flight_per_rank(const zero3::pipeline::Schedule& schedule) {
  std::vector<int64_t> peak;
  for (const std::vector<zero3::pipeline::Action>& actions : schedule.actions) {
    int64_t now = 0, most = 0;
    for (const zero3::pipeline::Action& a : actions) {
      if (a.kind == zero3::pipeline::ActionKind::forward) most = std::max(most, ++now);
      if (a.kind == zero3::pipeline::ActionKind::backward) --now;
    }
    peak.push_back(most);
  }
  return peak;
}

// --dry-run with pipeline stages: the partition, the schedule and each pipeline rank's memory: its stages' units
// under ZeRO over the stage's data-parallel ranks, and per micro-batch it holds in flight a runner over its largest
// stage's layers (`stage_act(k)`: the activations of a runner of k transformer layers) plus the received activation.
void print_pipeline_plan(const zero3::Config& cfg, const ModelConfig& mc, const BatchShape& shape, int64_t world,
                         int64_t per_node, const std::function<int64_t(int64_t)>& stage_act, int64_t act_bytes) {
  const int P = static_cast<int>(*cfg.pipeline.stages);
  const int V = static_cast<int>(cfg.zero3.pipeline_virtual_stages);
  const int64_t D = world / P, gas = *cfg.gradient_accumulation_steps, L = mc.num_hidden_layers;
  const zero3::pipeline::Schedule schedule = zero3::pipeline::make_schedule(
      zero3::pipeline::parse_schedule(cfg.zero3.pipeline_schedule, "zero3.pipeline_schedule"), P, static_cast<int>(gas),
      V);
  std::vector<zero3::pipeline::LayerInfo> infos;
  for (const zero3::PipelineLayer& l : pipeline_layers(mc, shape)) infos.push_back({l.name, l.parameters});
  const std::vector<int> bounds = zero3::pipeline::partition_layers(infos, P * V, cfg.pipeline.partition);
  const std::vector<int64_t> in_flight = in_flight_per_rank(schedule);
  const zero3::ModelDesc whole = engine_model_desc(mc, "llama");
  const int64_t boundary = shape.tokens() * mc.hidden_size * act_bytes;
  std::printf(
      "\npipeline: %d stages x %lld data-parallel ranks (%s), schedule %s, %d virtual stage(s) per rank, "
      "%lld micro-batches per step, bubble %.1f%%\n",
      P, static_cast<long long>(D), cfg.zero3.pipeline_stage_order.c_str(), cfg.zero3.pipeline_schedule.c_str(), V,
      static_cast<long long>(gas), 100.0 * zero3::pipeline::bubble_fraction(schedule));
  std::printf("  partition (%s): %s\n", cfg.pipeline.partition.c_str(),
              zero3::pipeline::describe_partition(infos, bounds).c_str());
  std::printf("  boundary: %lld elements per micro-batch and direction (micro-batch x seq x hidden), %s\n",
              static_cast<long long>(shape.tokens() * mc.hidden_size), format_bytes(boundary).c_str());
  std::printf(
      "  per rank of each pipeline rank (ZeRO over its stage's %lld ranks; per micro-batch in flight a runner "
      "over its largest stage's layers and the received activation):\n",
      static_cast<long long>(D));
  for (int p = 0; p < P; ++p) {
    zero3::ModelDesc desc;
    desc.name = "llama pipeline rank " + std::to_string(p);
    std::string stages;
    int64_t runner = 0;
    for (int v = 0; v < V; ++v) {
      const int st = p + v * P;
      const int a = bounds[static_cast<size_t>(st)], b = bounds[static_cast<size_t>(st) + 1];
      stages += (v ? ", " : "") + std::to_string(st);
      for (int i = a; i < b; ++i) desc.units.push_back(whole.units[static_cast<size_t>(i)]);
      const int64_t layers = std::min<int64_t>(b, L + 1) - std::max(a, 1);  // transformer layers of the stage
      runner = std::max(runner, stage_act(std::max<int64_t>(layers, 0)));
    }
    const int64_t flight = in_flight[static_cast<size_t>(p)];
    zero3::MemoryPlanOptions po;
    po.world_size = D;
    po.ranks_per_node = std::min(per_node, D);
    po.activation_bytes = flight * (runner + boundary);
    const zero3::MemoryPlan plan = zero3::plan_memory(desc, cfg, po);
    std::printf(
        "    rank %d (stage%s %s: %zu units, %lld parameters): %lld micro-batch(es) in flight x %s, "
        "device %s, host %s\n",
        p, V > 1 ? "s" : "", stages.c_str(), desc.units.size(), static_cast<long long>(plan.total_params),
        static_cast<long long>(flight), format_bytes(runner + boundary).c_str(),
        format_bytes(plan.rank_bytes(zero3::MemoryTier::device)).c_str(),
        format_bytes(plan.rank_bytes(zero3::MemoryTier::host)).c_str());
  }
}

int dry_run(const TrainOptions& o, zero3::Config cfg, const ModelConfig& mc) {
  zero3::LaunchInfo launch = zero3::detect_launch();
  const int64_t world = o.world_size > 0 ? o.world_size : launch.world_size;
  const int64_t per_node = o.ranks_per_node > 0 ? o.ranks_per_node : std::min<int64_t>(launch.local_world_size, world);
  apply_flags(cfg, o);
  zero3::ResolveInputs in = resolve_inputs(cfg, o, mc);
  in.world_size = world;
  zero3::resolve(cfg, in);
  const bool gpu = o.device == "cuda" || (o.device == "auto" && cfg.zero3.device.rfind("cuda", 0) == 0);
  if (o.device == "cpu") cfg.zero3.device = "cpu";
  const zero3::DType compute = cfg.compute_dtype();
  const zero3::DType grads = cfg.grad_accum_dtype.value_or(zero3::DType::f32);
  const BatchShape shape{*cfg.train_micro_batch_size_per_gpu, o.seq_len};
  // On a GPU the activations are in the compute dtype; on the CPU they are fp32 (16-bit units widened).
  const zero3::DeviceType where = gpu ? zero3::DeviceType::cuda : zero3::DeviceType::cpu;
  const ActivationEstimate act = estimate_activations(mc, shape, o.grad_checkpointing, where, compute, grads);

  zero3::MemoryPlanOptions po;
  po.world_size = world;
  po.ranks_per_node = per_node;
  po.activation_bytes = act.total();
  const zero3::MemoryPlan plan = zero3::plan_memory(engine_model_desc(mc, "llama"), cfg, po);

  std::printf("llama3_train --dry-run: nothing is allocated\n");
  std::printf("  model        %s (%s)\n", describe(mc).c_str(), o.model.c_str());
  std::printf("  config       %s: ZeRO stage %d, %s, offload_param %s, offload_optimizer %s\n", o.deepspeed.c_str(),
              cfg.zero.stage, precision_name(compute),
              cfg.zero.offload_param.device == zero3::OffloadDevice::none  ? "none"
              : cfg.zero.offload_param.device == zero3::OffloadDevice::cpu ? "cpu"
                                                                           : "nvme",
              cfg.zero.offload_optimizer.device == zero3::OffloadDevice::none  ? "none"
              : cfg.zero.offload_optimizer.device == zero3::OffloadDevice::cpu ? "cpu"
                                                                               : "nvme");
  std::printf(
      "  job          %lld ranks, %lld per node (%lld nodes); micro-batch %lld x seq %lld, grad-accum %lld, "
      "global batch %lld sequences = %lld tokens per step\n",
      static_cast<long long>(world), static_cast<long long>(per_node), static_cast<long long>(plan.nodes),
      static_cast<long long>(shape.batch), static_cast<long long>(shape.seq),
      static_cast<long long>(*cfg.gradient_accumulation_steps), static_cast<long long>(*cfg.train_batch_size),
      static_cast<long long>(*cfg.train_batch_size * o.seq_len));
  std::printf("\nactivations per rank (%s, activation checkpointing %s, %lld tokens per micro-batch):\n",
              gpu ? (compute == zero3::DType::f32 ? "fp32 GPU path" : "bf16 GPU path") : "fp32 CPU path",
              o.grad_checkpointing ? "on" : "off", static_cast<long long>(shape.tokens()));
  if (gpu && compute == zero3::DType::f16) {
    std::printf("  (fp16 is not supported by the model's CUDA kernels: a run would stop; counted as 2 bytes)\n");
  }
  auto row = [](const char* what, int64_t bytes) { std::printf("  %-62s %10s\n", what, format_bytes(bytes).c_str()); };
  row(o.grad_checkpointing ? "layer inputs kept for recomputation (L+1 x tokens x hidden)"
                           : "residual streams (L+1 x tokens x hidden)",
      act.layer_inputs);
  row(o.grad_checkpointing ? "one layer's cache, refilled in backward" : "every layer's cache", act.layer_caches);
  row("layer workspace, dx, the batch's ids, targets and rope tables", act.workspace);
  row(gpu ? "attention scores (kv heads in chunks up to 1 GiB)" : "attention scores of one head", act.attention);
  row("one chunk of logits (chunked cross-entropy)", act.loss_chunk);
  if (act.unit_staging > 0) row("dtype staging of the largest unit (parameters, gradients)", act.unit_staging);
  row("total", act.total());
  if (cfg.pipeline.stages.value_or(1) > 1) {
    check_pipeline_model(mc, static_cast<int>(*cfg.pipeline.stages));
    // On a GPU activations are in the compute dtype, on the CPU in fp32 (the runner's act dtype).
    // A stage's runner: the estimate of a model with the stage's transformer layers (the embedding's and the
    // head's buffers counted on every stage).
    auto stage_act = [&](int64_t layers) {
      ModelConfig part = mc;
      part.num_hidden_layers = layers;
      return estimate_activations(part, shape, o.grad_checkpointing, where, compute, grads).total();
    };
    print_pipeline_plan(cfg, mc, shape, world, per_node, stage_act,
                        gpu ? static_cast<int64_t>(zero3::dtype_size(compute)) : int64_t{4});
    std::printf("\nthe whole model unpipelined over the %lld ranks, for comparison:\n", static_cast<long long>(world));
  }
  std::printf("\n%s\n", zero3::format_memory_plan(plan).c_str());
  return 0;
}

// ---- Training ---------------------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<ByteTokenizer>();
  return Llama3Tokenizer::from_file(spec);
}

std::string describe_memory(const zero3::MemoryStats& m, int64_t activations) {
  return "params " + format_bytes(m.params) + ", master " + format_bytes(m.master) + ", grads " +
         format_bytes(m.grads) + ", optimizer " + format_bytes(m.optimizer_state) + ", buffers " +
         format_bytes(m.buffers) + ", activations " + format_bytes(activations) +
         (m.peak_host_total > 0
              ? ", host " + format_bytes(m.host_total()) + " (peak " + format_bytes(m.peak_host_total) + ")"
              : std::string());
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// The product name of the device the model runs on (the MFU peak is looked up by it).
std::string gpu_product_name(const zero3::Device& device) {
#if LLAMA3_HAVE_CUDA
  if (device.type() == zero3::DeviceType::cuda) return cuda_device_name(device.index());
#endif
  return device.type() == zero3::DeviceType::cpu ? "host" : device.name();
}

void check_checkpoint_flags(const TrainOptions& o) {
  if ((o.resume || o.save_interval > 0) && o.save_dir.empty()) {
    throw zero3::InvalidArgument(std::string(o.resume ? "--resume" : "--save-interval") +
                                 " needs --save-dir (the directory holding the checkpoints)");
  }
}

// Every directory the run will write into, checked before training: a read-only, non-directory or full
// --save-dir would otherwise show at the first save (--save-interval steps in), a bad --consolidate-to only
// after the last step. Each rank checks, since each rank writes its own shard file.
void check_output_paths(const TrainOptions& o, const zero3::Config& cfg, const ModelConfig& mc, int64_t world,
                        int64_t local_world) {
  if (!o.save_dir.empty()) {
    int64_t bytes = zero3::checkpoint_bytes(engine_model_desc(mc), world);
    // With node-local storage a node's directory holds its own ranks' files only.
    if (cfg.checkpoint.use_node_local_storage) bytes = bytes / world * local_world;
    zero3::check_output_directory(o.save_dir, "--save-dir", static_cast<uint64_t>(bytes), "one checkpoint");
  }
  if (!o.consolidate_to.empty()) zero3::check_output_directory(o.consolidate_to, "--consolidate-to");
}

// What the program saves beside the engine's state to continue exactly: the sampler's position and the facts
// that must not change across a resume.
zero3::CheckpointExtras sampler_extras(const DistributedSampler& sampler, const TrainOptions& o,
                                       const PackedDataset& data, int data_parallel_ranks) {
  return {{"sampler_epoch", std::to_string(sampler.state().epoch)},
          {"data_parallel_ranks", std::to_string(data_parallel_ranks)},
          {"sampler_position", std::to_string(sampler.state().position)},
          {"seq_len", std::to_string(o.seq_len)},
          {"data_sequences", std::to_string(data.num_sequences())},
          {"seed", std::to_string(o.seed)}};
}

// --pipeline-boundary-dtype: the dtype between stages (nullopt for "activation": the backend's).
std::optional<zero3::DType> boundary_dtype(const TrainOptions& o, const zero3::Config& cfg) {
  if (o.pipeline_boundary_dtype == "compute") return cfg.compute_dtype();
  if (o.pipeline_boundary_dtype == "activation") return std::nullopt;
  return zero3::parse_dtype(o.pipeline_boundary_dtype);
}

// Whether the run is pipelined (pipeline.stages above 1, after --pipeline-stages). A pipelined run consolidates its
// final checkpoint (no engine holds every unit), so --consolidate-to needs --save-dir there.
bool pipelined_run(const TrainOptions& o, const zero3::Config& cfg, const ModelConfig& mc) {
  const int64_t stages = cfg.pipeline.stages.value_or(1);
  if (stages <= 1) return false;
  check_pipeline_model(mc, static_cast<int>(stages));
  if (!o.consolidate_to.empty() && o.save_dir.empty()) {
    throw zero3::InvalidArgument("--consolidate-to with " + std::to_string(stages) +
                                 " pipeline stages (pipeline.stages or --pipeline-stages) needs --save-dir: the "
                                 "pipelined run writes the Hugging Face files from its final checkpoint");
  }
  return true;
}

int train(const TrainOptions& o, zero3::Config file_cfg, const ModelConfig& mc, const std::string& model_json) {
  // Where the model runs: --device, else the config's zero3.device; "auto" means the CPU here.
  std::string device_name = o.device;
  if (device_name == "auto") device_name = file_cfg.zero3.device == "auto" ? "cpu" : file_cfg.zero3.device;
  const bool gpu = device_name == "cuda";
  check_checkpoint_flags(o);

  // Join the job, make the device and the engine: zero3::initialize() with the config's zero3 section (backend,
  // timeout, network) and "auto" resolved from the flags and the model. On a GPU each rank takes the GPU of its
  // local rank and talks NCCL; on the CPU the ranks talk Gloo (or nothing, alone). The program prints the
  // steps_per_print line itself (with loss, tokens/s and memory), so the engine's own line is off.
  apply_flags(file_cfg, o);
  const bool pipelined = pipelined_run(o, file_cfg, mc);
  const int64_t steps_per_print = file_cfg.steps_per_print;
  file_cfg.steps_per_print = 0;
  zero3::InitOptions init;
  init.device = device_name;
  init.resolve = resolve_inputs(file_cfg, o, mc);
  zero3::Session session = zero3::initialize(std::move(file_cfg), init);
  zero3::Device& device = *session.device;
  const zero3::Config& cfg = session.config;
  const zero3::LaunchInfo& launch = session.launch;
  const int rank = session.comm->rank(), world = session.comm->size();
  const int64_t micro = *cfg.train_micro_batch_size_per_gpu, gas = *cfg.gradient_accumulation_steps;
  // The data-parallel ranks: each stage's with pipeline stages, else all. Each takes its own share of the data.
  const int stages = static_cast<int>(cfg.pipeline.stages.value_or(1));
  const int data_world = world / stages;
  // Pipelined, pipeline.activation_checkpoint_interval 1 turns it on too (PipelineStageModel).
  const bool checkpointing = o.grad_checkpointing || (pipelined && cfg.pipeline.activation_checkpoint_interval == 1);
  const zero3::DType compute = cfg.compute_dtype();
  const std::string hardware = gpu_product_name(device);
  const std::optional<double> peak_flops = gpu ? peak_bf16_flops(hardware) : std::nullopt;

  if (rank == 0) {
    std::printf("llama3_train (zero3 %s)\n", zero3::version().c_str());
    std::printf("  model      %s (%s)\n", describe(mc).c_str(), o.model.c_str());
    std::printf("  ranks      %d (%s, %s), OMP_NUM_THREADS=%s OMP_WAIT_POLICY=%s per rank\n", world,
                launch.launcher.c_str(), session.comm->backend(), std::getenv("OMP_NUM_THREADS"),
                std::getenv("OMP_WAIT_POLICY"));
    std::printf(
        "  batch      micro-batch %lld x seq %lld x grad-accum %lld x %d %sranks = %lld tokens per step, %lld "
        "steps\n",
        static_cast<long long>(micro), static_cast<long long>(o.seq_len), static_cast<long long>(gas), data_world,
        pipelined ? "data-parallel " : "", static_cast<long long>(micro * o.seq_len * gas * data_world),
        static_cast<long long>(o.steps));
    if (pipelined) {
      const std::optional<zero3::DType> boundary = boundary_dtype(o, cfg);
      std::printf(
          "  pipeline   %d stages x %d data-parallel ranks (%s), schedule %s, %lld virtual stage(s) per rank, "
          "boundaries in %s\n",
          stages, data_world, cfg.zero3.pipeline_stage_order.c_str(), cfg.zero3.pipeline_schedule.c_str(),
          static_cast<long long>(cfg.zero3.pipeline_virtual_stages),
          boundary ? std::string(zero3::dtype_name(*boundary)).c_str() : "the backend's activation dtype");
    }
    std::string peak = !gpu         ? ""
                       : peak_flops ? ", peak dense bf16 " + fmt("%.0f", *peak_flops / 1e12) + " TFLOP/s"
                                    : ", peak FLOP/s unknown: MFU n/a";
    std::printf("  device     %s (%s)%s\n", device.name().c_str(), hardware.c_str(), peak.c_str());
    std::string precision = precision_name(compute);
    if (compute != zero3::DType::f32 && gpu) {
      precision +=
          " parameters, activations and GEMM inputs on the GPU (f32 accumulation and weight gradients), fp32 "
          "master weights and Adam state";
    } else if (compute != zero3::DType::f32) {
      precision +=
          " parameter copies (gathered and communicated), fp32 master weights and Adam state; the CPU kernels compute "
          "in fp32 on the widened weights (no 16-bit arithmetic on CPU)";
    }
    std::printf("  precision  %s\n", precision.c_str());
    std::printf("  checkpointing (activations) %s\n", checkpointing ? "on" : "off");
    zero3::Config shown = cfg;
    shown.steps_per_print = steps_per_print;  // the program's line, not the engine's
    std::printf("  resolved DeepSpeed config (%s):\n%s\n", o.deepspeed.c_str(), zero3::to_json(shown).c_str());
    std::fflush(stdout);
  }

  check_output_paths(o, cfg, mc, world, launch.local_world_size);

  // Data: every rank packs the same token stream and the sampler hands each rank different sequences.
  auto t_data = Clock::now();
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(o.tokenizer);
  const std::vector<std::string> data_paths = o.data.empty() ? default_text_paths() : o.data;
  PackedDataset dataset = PackedDataset::from_paths(data_paths, *tokenizer, o.seq_len);
  auto check_vocab = [&](const PackedDataset& d, const char* what) {
    if (static_cast<int64_t>(tokenizer->vocab_size()) > mc.vocab_size ||
        static_cast<int64_t>(d.max_token()) >= mc.vocab_size) {
      throw zero3::InvalidArgument(std::string(what) + " holds token " + std::to_string(d.max_token()) +
                                   " (tokenizer vocabulary " + std::to_string(tokenizer->vocab_size()) +
                                   ") but the model's vocab_size is " + std::to_string(mc.vocab_size) + " (" + o.model +
                                   ")");
    }
  };
  check_vocab(dataset, "the data");
  // Pipelined, the stages read their micro-batches by index (SampledMicroBatches, the same sequences); this
  // sampler then only sizes the data.
  DistributedSampler sampler(dataset.num_sequences(), pipelined ? 0 : rank, data_world, o.seed);
  if (sampler.per_rank() < micro * gas) {
    throw zero3::InvalidArgument("the data has " + std::to_string(dataset.num_sequences()) + " sequences of " +
                                 std::to_string(o.seq_len) + " tokens: fewer than one optimizer step needs (" +
                                 std::to_string(micro * gas * data_world) + ")");
  }
  const double epoch_steps = static_cast<double>(sampler.per_rank()) / static_cast<double>(micro * gas);
  log::info_rank0("data: ", dataset.num_tokens(), " tokens from ", data_paths.size(), " path(s), ",
                  dataset.num_sequences(), " sequences of ", o.seq_len, " (", fmt("%.1f", epoch_steps),
                  " steps per epoch), tokenized in ", fmt("%.2f", seconds_since(t_data)), " s");
  // Held-out data: every sequence once per evaluation, split across the ranks.
  std::optional<PackedDataset> eval_set;
  std::optional<EvalBatches> eval_batches;
  if (!o.eval_data.empty()) {
    eval_set = PackedDataset::from_paths(o.eval_data, *tokenizer, o.seq_len);
    check_vocab(*eval_set, "the evaluation data");
    // Pipelined, the stages read every data-parallel rank's batches by index (EvalMicroBatches); these name the sizes.
    eval_batches.emplace(*eval_set, pipelined ? 0 : rank, data_world, micro, o.eval_batches, kIgnoreIndex);
    log::info_rank0("evaluation data: ", eval_batches->sequences(), " of ", eval_set->num_sequences(),
                    " sequences per evaluation (", eval_batches->batches(), " micro-batches per rank), after ",
                    o.eval_interval > 0 ? "every " + std::to_string(o.eval_interval) + " steps and " : "",
                    "the last step");
  }

  // The model on the engine.
  EngineModelOptions mo;
  mo.activation_checkpointing = checkpointing;
  mo.init_from = o.init_from;
  mo.init_from_strict = o.init_from_strict;
  mo.time_phases = cfg.wall_clock_breakdown;
  const BatchShape shape{micro, o.seq_len};
  std::optional<EngineModel> model;
  std::optional<SampledMicroBatches> micro_batches;
  std::optional<PipelineStageModel> stage_model;
  std::optional<EvalMicroBatches> eval_micro_batches;
  std::unique_ptr<zero3::PipelineEngine> pipe;
  auto t_init = Clock::now();
  if (pipelined) {
    // The stages' units declared and materialized by the PipelineEngine (collective over the world).
    micro_batches.emplace(dataset, data_world, o.seed, micro);
    stage_model.emplace(mc, shape, *micro_batches, gas, data_world, stages, device, cfg.compute_dtype(),
                        boundary_dtype(o, cfg), mo);
    if (eval_set) {
      eval_micro_batches.emplace(*eval_set, data_world, micro, o.eval_batches, gas, kIgnoreIndex);
      stage_model->set_evaluation(*eval_micro_batches, eval_micro_batches->per_evaluation());
    }
    zero3::PipelineOptions po;
    po.activation_dtype = stage_model->boundary_dtype();
    pipe = std::make_unique<zero3::PipelineEngine>(cfg, session.comm, device, pipeline_layers(mc, shape), *stage_model,
                                                   po);
    if (rank == 0) {
      std::vector<zero3::pipeline::LayerInfo> infos;
      for (const zero3::PipelineLayer& l : pipe->layers()) infos.push_back({l.name, l.parameters});
      std::printf("  partition  %s\n", zero3::pipeline::describe_partition(infos, pipe->stage_bounds()).c_str());
      std::fflush(stdout);
    }
  } else {
    model.emplace(*session.engine, mc, mo);
    session.engine->materialize();
  }
  zero3::Engine& engine = pipelined ? pipe->engine() : *session.engine;
  log::info_rank0("model: ", engine.num_units(), " units", pipelined ? " (rank 0's stages)" : "", " materialized in ",
                  fmt("%.2f", seconds_since(t_init)), " s (",
                  o.init_from.empty() ? "initialized from the config" : "from " + o.init_from, ")");

  // Resume: the engine's state (weights, Adam, counters, loss scale) and the sampler's position.
  int64_t start_step = 0;
  if (o.resume) {
    const auto t_load = Clock::now();
    const zero3::LoadedCheckpoint ck = pipelined ? zero3::load_checkpoint(*pipe, o.save_dir, *o.resume)
                                                 : zero3::load_checkpoint(engine, o.save_dir, *o.resume);
    const std::string where = ck.path.string();
    for (const char* key : {"seq_len", "data_sequences", "seed"}) {
      const int64_t saved = ck.extra_int(key);
      const int64_t now = std::string(key) == "seq_len"          ? o.seq_len
                          : std::string(key) == "data_sequences" ? dataset.num_sequences()
                                                                 : static_cast<int64_t>(o.seed);
      if (saved != now) {
        throw zero3::CheckpointError(where + ": saved with " + key + " " + std::to_string(saved) + ", this run has " +
                                     std::to_string(now) + ": the data order would not continue where it stopped");
      }
    }
    DistributedSampler::State st;
    st.epoch = ck.extra_int("sampler_epoch");
    st.position = ck.extra_int("sampler_position");
    // The data-parallel ranks the sampler was split over (a pipelined run's: its world over the stages; checkpoints
    // without the key were saved by unpipelined runs, on all their ranks).
    const int64_t saved_data_ranks =
        ck.extras.count("data_parallel_ranks") ? ck.extra_int("data_parallel_ranks") : ck.saved_world_size;
    start_step = ck.training_state.global_steps;
    if (pipelined) {
      // The stages read micro-batch data_index = step x accumulation + k (SampledMicroBatches): the data continues
      // from the restored step count, where this run's sampler would be after start_step steps.
      for (int64_t n = 0; n < start_step * gas * micro; ++n) sampler.next();
      if (sampler.state().epoch != st.epoch || sampler.state().position != st.position) {
        log::warn_rank0("resume: the checkpoint's data position (epoch ", st.epoch, ", sequence ", st.position,
                        " of each rank's share) is not where this pipelined run's ", data_world,
                        " data-parallel ranks x ", gas, " micro-batches reach at step ", start_step, " (epoch ",
                        sampler.state().epoch, ", sequence ", sampler.state().position,
                        "): the data continues from the step count");
      }
    } else if (saved_data_ranks != world) {
      // Each rank took `position` sequences of its share; on another number of data-parallel ranks the shares
      // differ, so continue with the next epoch's shuffle rather than repeat or skip sequences unevenly.
      log::warn_rank0("resume: saved on ", saved_data_ranks, " data-parallel ranks, running on ", world,
                      ": the data continues at the start of epoch ", st.epoch + 1);
      st.epoch += 1;
      st.position = 0;
    }
    if (!pipelined) sampler.restore(st);
    log::info_rank0("resumed from ", where, " (step ", start_step, ", ", ck.saved_world_size, " ranks, stage ",
                    ck.saved_stage, ck.resharded ? ", resharded" : "", ") in ", fmt("%.2f", seconds_since(t_load)),
                    " s");
    if (start_step >= o.steps)
      log::warn_rank0("resume: the checkpoint is at step ", start_step, " >= --steps ", o.steps);
  }
  std::string last_checkpoint;
  auto save = [&](int64_t step) {
    const auto t_save = Clock::now();
    const std::string tag = "global_step" + std::to_string(step);
    const zero3::SavedCheckpoint saved =
        pipelined ? zero3::save_checkpoint(*pipe, o.save_dir, tag, sampler_extras(sampler, o, dataset, data_world))
                  : zero3::save_checkpoint(engine, o.save_dir, tag, sampler_extras(sampler, o, dataset, data_world));
    last_checkpoint = saved.path.string();
    log::info_rank0("checkpoint ", saved.path.string(), ": ", saved.files, " file(s), ",
                    format_bytes(static_cast<int64_t>(saved.bytes)), " in ", fmt("%.2f", seconds_since(t_save)), " s");
  };

  // Outputs (rank 0).
  std::unique_ptr<MetricsCsv> metrics;
  std::unique_ptr<Monitors> monitor;
  std::string metrics_path = o.metrics;
  if (metrics_path.empty()) {
    metrics_path = o.save_dir.empty() ? "llama3_train_metrics.csv" : (fs::path(o.save_dir) / "metrics.csv").string();
  }
  if (rank == 0) {
    if (metrics_path != "none") metrics = std::make_unique<MetricsCsv>(metrics_path, start_step > 0);
    monitor = std::make_unique<Monitors>(cfg);
  }
  ProgressBar bar(o.steps, start_step, rank == 0 && ProgressBar::stdout_is_terminal());

  // The device's peak: on cuda the Device's counters hold the engine's buffers, the model's and the kernels' own
  // workspaces (one pool); on the host, the runner's bytes and the CPU ops' workspaces come on top.
  auto activation_bytes = [&] { return pipelined ? stage_model->activation_bytes() : model->activation_bytes(); };
  auto device_peak = [&] {
    const ModelOps& ops = pipelined ? stage_model->ops() : model->ops();
    return device.peak_bytes_in_use() + (gpu ? 0 : ops.workspace_bytes() + activation_bytes());
  };

  // Evaluation (collective): the mean loss over every target of the held-out set, on all ranks.
  auto evaluate = [&]() {
    if (pipelined) {
      // eval_batch() after eval_batch() over the held-out set (padded to whole pipeline batches): each returns the
      // mean of its micro-batches' shares of the mean over every target, so their mean is that mean.
      const int64_t calls = eval_micro_batches->per_evaluation() / gas;
      double sum = 0;
      for (int64_t i = 0; i < calls; ++i) sum += pipe->eval_batch();
      return sum / static_cast<double>(calls);
    }
    std::vector<int32_t> eids(static_cast<size_t>(micro * o.seq_len)), etargets(eids.size());
    int64_t count = 0;
    // The losses stay on the device until the last batch: one read for the whole evaluation.
    LossOptions lo;
    lo.defer_loss_sum = true;
    zero3::EvalMode mode = engine.evaluate();
    for (int64_t b = 0; b < eval_batches->batches(); ++b) {
      eval_batches->fill(b, eids.data(), etargets.data());
      count += model->evaluate(eids.data(), etargets.data(), shape, lo).count;
      mode.next_batch();
    }
    mode.end();
    float sum = static_cast<float>(model->take_loss_sum());
    engine.all_reduce_host(&sum, 1);
    // The targets of all ranks, counted exactly (the normalizer of one micro-batch per rank, times the ranks).
    const double targets_all = step_loss_normalizer(engine, count, 1) * world;
    return targets_all > 0 ? sum / targets_all : 0.0;
  };

  double first_eval = NAN, last_eval = NAN;
  auto evaluate_and_print = [&](int64_t after_step) {
    const auto t_eval = Clock::now();
    const double eval_loss = evaluate();
    if (std::isnan(first_eval)) first_eval = eval_loss;
    last_eval = eval_loss;
    if (rank == 0) {
      bar.clear();
      std::printf("eval after step %lld | loss %.4f | perplexity %.2f | %lld sequences in %.1f s\n",
                  static_cast<long long>(after_step), eval_loss, std::exp(eval_loss),
                  static_cast<long long>(eval_batches->sequences()), seconds_since(t_eval));
      std::fflush(stdout);
    }
    return eval_loss;
  };

  // Training.
  const int64_t print_every = std::max<int64_t>(1, steps_per_print);
  const int64_t tokens_per_step = micro * o.seq_len * gas * data_world;
  std::vector<int32_t> ids(static_cast<size_t>(gas * micro * o.seq_len)), targets(ids.size());
  std::vector<uint32_t> row(static_cast<size_t>(o.seq_len));
  const auto t_train = Clock::now();
  double window_time = 0, window_fwd = 0, window_bwd = 0, window_opt = 0, window_comm = 0;
  int64_t window_steps = 0;
  double first_loss = NAN, last_loss = NAN;
  std::vector<std::pair<int64_t, double>> curve;
  // One optimizer step: the global batch's mean loss, the step's outcome and the time of the engine's step() calls
  // (NaN pipelined: the step runs inside PipelineEngine::train_batch(), with no time of its own).
  struct StepOutcome {
    double loss = 0;
    zero3::StepResult r;
    double opt_time = 0, boundary_step = 0;
  };
  auto unpipelined_step = [&] {
    for (int64_t k = 0; k < gas * micro; ++k) {
      const int64_t index = sampler.next();
      dataset.sequence(index, row.data(), targets.data() + k * o.seq_len);
      for (int64_t t = 0; t < o.seq_len; ++t)
        ids[static_cast<size_t>(k * o.seq_len + t)] = static_cast<int32_t>(row[t]);
    }
    const int64_t local_targets = count_targets(targets.data(), static_cast<int64_t>(targets.size()), mc.vocab_size);
    LossOptions lo;
    lo.normalizer = step_loss_normalizer(engine, local_targets, gas);
    // The micro-batches' losses are summed on the device, with no wait per micro-batch, and read once before the
    // window's last step(): that wait ends with the backward, which the boundary's own read in step() waits for
    // too, so the host still runs ahead of the optimizer's update into the next step.
    lo.defer_loss_sum = true;
    double loss_sum = 0;
    StepOutcome out;
    for (int64_t k = 0; k < gas; ++k) {
      const size_t off = static_cast<size_t>(k * micro * o.seq_len);
      model->forward_backward(ids.data() + off, targets.data() + off, shape, lo);
      if (k + 1 == gas) loss_sum = model->take_loss_sum();
      const auto t_opt = Clock::now();
      out.r = engine.step();
      out.boundary_step = seconds_since(t_opt);
      out.opt_time += out.boundary_step;
    }
    float sum = static_cast<float>(loss_sum);
    engine.all_reduce_host(&sum, 1);
    const double total_targets = lo.normalizer * static_cast<double>(world * gas);
    out.loss = total_targets > 0 ? sum / total_targets : 0.0;
    return out;
  };
  auto pipelined_step = [&] {
    const zero3::PipelineStepResult p = pipe->train_batch();
    // The sampler where the unpipelined loop's would be (what a checkpoint records): the step's sequences taken.
    for (int64_t k = 0; k < gas * micro; ++k) sampler.next();
    return StepOutcome{p.loss, p.step, NAN, NAN};
  };
  for (int64_t step = start_step; step < o.steps; ++step) {
    const auto t_step = Clock::now();
    if (pipelined) {
      stage_model->reset_times();
    } else {
      model->reset_times();
    }
    engine.reset_schedule_stats();
    const StepOutcome outcome = pipelined ? pipelined_step() : unpipelined_step();
    const double loss = outcome.loss, opt_time = outcome.opt_time, boundary_step = outcome.boundary_step;
    const zero3::StepResult& r = outcome.r;
    const double step_time = seconds_since(t_step);
    const double comm_wait = engine.schedule_stats().comm_wait_seconds;
    const double agreement = engine.schedule_stats().agreement_seconds;
    if (step == start_step) first_loss = loss;
    last_loss = loss;

    const PhaseTimes& pt = pipelined ? stage_model->times() : model->times();
    window_time += step_time;
    window_fwd += pt.forward;
    window_bwd += pt.backward;
    window_opt += opt_time;
    window_comm += comm_wait;
    ++window_steps;
    std::optional<double> eval_loss;
    if (eval_batches && (step + 1 == o.steps || (o.eval_interval > 0 && (step + 1) % o.eval_interval == 0))) {
      eval_loss = evaluate_and_print(step + 1);
    }
    const zero3::MemoryStats mem = engine.memory();
    if (rank == 0) {
      StepMetrics m;
      m.eval_loss = eval_loss;
      m.step = step + 1;
      m.samples = (step + 1) * micro * gas * data_world;
      m.tokens = (step + 1) * tokens_per_step;
      m.loss = loss;
      m.lr = r.lr;
      m.grad_norm = r.grad_norm;
      m.clip_coef = r.clip_coef;
      m.loss_scale = engine.loss_scale();
      m.skipped = !r.applied;
      m.step_time = step_time;
      m.tokens_per_s = static_cast<double>(tokens_per_step) / step_time;
      m.forward = pt.forward;
      m.backward = pt.backward;
      m.optimizer = opt_time;
      m.comm_wait = comm_wait;
      m.boundary_step = boundary_step;
      m.agreement = agreement;
      m.mem_params = mem.params;
      m.mem_master = mem.master;
      m.mem_grads = mem.grads;
      m.mem_optimizer = mem.optimizer_state;
      m.mem_buffers = mem.buffers;
      m.mem_activations = activation_bytes();
      m.mem_peak = mem.peak_total;
      m.mem_device_peak = device_peak();
      m.mem_host = mem.host_total();
      m.mem_host_peak = mem.peak_host_total;
      m.mfu = model_flops_utilization(mc, o.seq_len, m.tokens_per_s / world, peak_flops);
      if (metrics) metrics->write(m);
      monitor->write_event("Train/Samples/train_loss", loss, m.samples);
      monitor->write_event("Train/Samples/lr", r.lr, m.samples);
      if (eval_loss) monitor->write_event("Eval/Samples/eval_loss", *eval_loss, m.samples);
      if (compute == zero3::DType::f16) monitor->write_event("Train/Samples/loss_scale", m.loss_scale, m.samples);
      if (cfg.wall_clock_breakdown) {
        monitor->write_event("Train/Samples/elapsed_time_ms_forward", pt.forward * 1e3, m.samples);
        monitor->write_event("Train/Samples/elapsed_time_ms_backward", pt.backward * 1e3, m.samples);
        monitor->write_event("Train/Samples/elapsed_time_ms_step", opt_time * 1e3, m.samples);
      }
      const bool print = (step + 1) % print_every == 0 || step == start_step || step + 1 == o.steps;
      if (print) {
        const double window_tokens_per_s = window_steps * static_cast<double>(tokens_per_step) / window_time;
        curve.emplace_back(step + 1, loss);
        bar.clear();
        std::string line = "step " + std::to_string(step + 1) + "/" + std::to_string(o.steps) + " | loss " +
                           fmt("%.4f", loss) + " | lr " + fmt("%.3e", r.lr) + " | grad norm " +
                           fmt("%.4f", r.grad_norm) + (r.applied ? "" : " (overflow: skipped)") + " | " +
                           fmt("%.0f", window_tokens_per_s) + " tokens/s";
        if (gpu) {
          const std::optional<double> mfu =
              model_flops_utilization(mc, o.seq_len, window_tokens_per_s / world, peak_flops);
          line += mfu ? " | MFU " + fmt("%.1f", *mfu * 100) + "%" : std::string(" | MFU n/a");
        }
        line += " | mem " + describe_memory(mem, activation_bytes());
        if (gpu) line += " | peak GPU " + format_bytes(m.mem_device_peak);
        if (cfg.wall_clock_breakdown) {
          const double n = static_cast<double>(window_steps);
          line += " | time/step: forward " + fmt("%.1f", window_fwd / n * 1e3) + " ms, backward " +
                  fmt("%.1f", window_bwd / n * 1e3) + " ms, step " + fmt("%.1f", window_opt / n * 1e3) +
                  " ms, comm wait " + fmt("%.1f", window_comm / n * 1e3) + " ms";
        }
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
      bar.update(step + 1, "loss " + fmt("%.4f", loss));
    }
    if ((step + 1) % print_every == 0) {
      window_time = window_fwd = window_bwd = window_opt = window_comm = 0;
      window_steps = 0;
    }
    if (!o.save_dir.empty() && o.save_interval > 0 && (step + 1) % o.save_interval == 0 && step + 1 < o.steps) {
      bar.clear();
      save(step + 1);
    }
  }
  bar.finish();
  const double train_seconds = seconds_since(t_train);
  // No step to run (--steps 0, or a resume at --steps): the evaluation of the weights as they are.
  if (o.steps <= start_step && eval_batches) evaluate_and_print(start_step);
  if (!o.save_dir.empty() && o.steps > start_step) save(o.steps);

  // The final weights as Hugging Face safetensors.
  uint64_t consolidated = 0;
  if (!o.consolidate_to.empty()) {
    const std::string dt = !o.consolidate_dtype.empty()    ? o.consolidate_dtype
                           : compute == zero3::DType::bf16 ? "bf16"
                                                           : "fp32";
    const auto t_save = Clock::now();
    if (pipelined) {
      // From the final checkpoint (saved above: --save-dir is required), on rank 0, with the same names and
      // config.json as EngineModel::save_hf writes.
      pipe->world().barrier();
      if (rank == 0) {
        zero3::ExportOptions eo;
        eo.dtype = dt == "bf16" ? zero3::DType::bf16 : zero3::DType::f32;
        eo.max_shard_bytes = zero3::safetensors::parse_size(o.consolidate_max_shard);
        consolidated = zero3::consolidate_checkpoint(o.save_dir, "latest", o.consolidate_to, eo).bytes;
        write_exported_config(o.consolidate_to, model_json, dt == "bf16" ? "bfloat16" : "float32");
      }
      pipe->world().barrier();
    } else {
      consolidated = model->save_hf(o.consolidate_to,
                                    dt == "bf16" ? zero3::safetensors::Dtype::bf16 : zero3::safetensors::Dtype::f32,
                                    zero3::safetensors::parse_size(o.consolidate_max_shard), model_json);
    }
    log::info_rank0("consolidated the final weights (", dt, ", ", format_bytes(static_cast<int64_t>(consolidated)),
                    ") into ", o.consolidate_to, " in ", fmt("%.2f", seconds_since(t_save)), " s");
  }
  // Every rank is done before rank 0 prints the summary.
  if (pipelined) {
    session.comm->barrier();
  } else {
    float finished = 1;
    engine.all_reduce_host(&finished, 1);
  }

  if (rank == 0) {
    const int64_t ran = o.steps - start_step;
    if (ran > 0) {
      std::printf("\ntrained steps %lld-%lld in %.1f s (%.0f tokens/s over %d ranks): loss %.4f -> %.4f\n",
                  static_cast<long long>(start_step + 1), static_cast<long long>(o.steps), train_seconds,
                  static_cast<double>(ran * tokens_per_step) / std::max(train_seconds, 1e-9), world, first_loss,
                  last_loss);
      if (!std::isnan(last_eval)) std::printf("evaluation loss %.4f -> %.4f\n", first_eval, last_eval);
      std::printf("loss curve (step: loss):");
      for (const auto& [s, l] : curve) std::printf(" %lld: %.3f", static_cast<long long>(s), l);
      std::printf("\n");
    } else {
      const std::string weights = o.resume              ? "from the checkpoint of step " + std::to_string(start_step)
                                  : o.init_from.empty() ? std::string("initialized from the config")
                                                        : "from " + o.init_from;
      std::printf("\nno training step (--steps %lld; weights %s)\n", static_cast<long long>(o.steps), weights.c_str());
      if (!std::isnan(last_eval)) {
        std::printf("evaluation loss %.4f (perplexity %.2f) of those weights\n", last_eval, std::exp(last_eval));
      } else {
        std::printf("no evaluation (no --eval-data)\n");
      }
    }
    if (!last_checkpoint.empty()) {
      std::printf("checkpoint   %s (resume with --save-dir %s --resume latest)\n",
                  fs::absolute(last_checkpoint).string().c_str(), o.save_dir.c_str());
    }
    if (metrics) std::printf("metrics      %s\n", fs::absolute(metrics->path()).string().c_str());
    if (monitor && monitor->csv().enabled()) {
      std::printf("csv_monitor  %s\n", fs::absolute(monitor->csv().dir()).string().c_str());
    }
    if (monitor && monitor->tensorboard()) {
      std::printf("tensorboard  %s\n", fs::absolute(monitor->tensorboard()->path().parent_path()).string().c_str());
    }
    if (!o.consolidate_to.empty()) {
      std::printf("weights      %s (Hugging Face safetensors + config.json)\n",
                  fs::absolute(o.consolidate_to).string().c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

int run(int argc, char** argv) {
  TrainOptions o = parse_train_options(argc, argv);
  if (o.help) {
    std::fputs(train_usage().c_str(), stdout);
    return 0;
  }
  if (o.version) {
    std::printf("llama3_train (zero3 %s)\n%s", zero3::version().c_str(), zero3::build_summary().c_str());
    return 0;
  }
  const TrainOptions defaults;
  o.model = find_default(o.model, o.model != defaults.model);
  o.deepspeed = find_default(o.deepspeed, o.deepspeed != defaults.deepspeed);
  if (o.steps < 0) throw zero3::InvalidArgument("--steps must be >= 0");
  const std::string model_json = read_text(o.model);
  const ModelConfig mc = parse_model_config(model_json, o.model);
  zero3::log::set_rank(zero3::detect_launch().rank);  // the config's warnings come from rank 0 only
  zero3::Config cfg = zero3::load_config(o.deepspeed);
  if (o.dry_run) return dry_run(o, std::move(cfg), mc);
  return train(o, std::move(cfg), mc, model_json);
}

}  // namespace
}  // namespace llama3

int main(int argc, char** argv) {
  try {
    llama3::setup_threads(argv);
    return llama3::run(argc, argv);
  } catch (const std::exception& e) {
    zero3::log::error("llama3_train: ", e.what());
  } catch (...) {
    zero3::log::error("llama3_train: failed with an exception that is not a std::exception");
  }
  return 1;
}

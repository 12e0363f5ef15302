// The engine's construction and teardown, the guards every public call passes, the lookups of units and
// parameters, and the memory report. The rest of EngineImpl lives by concern in the neighbouring engine_*.cpp
// files (engine_impl.hpp says which).
#include "zero/engine_impl.hpp"

#include <string_view>

#include "config/config_checks.hpp"
#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "zero/collective_guard.hpp"
#include "zero/resolved_config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

int64_t require_set(const std::optional<int64_t>& v, const char* key) {
  if (!v) {
    throw ConfigError(log::concat(key, ": is still \"auto\"; resolve the config (zero3::resolve with the model's ",
                                  "hidden_size) before creating the Engine"));
  }
  return *v;
}

}  // namespace

EngineImpl::EngineImpl(const Config& config, std::shared_ptr<Communicator> comm, Device& device,
                       PipelineStageBinding stage)
    : config_(config),
      user_comm_(std::move(comm)),
      comm_(user_comm_),
      device_(device),
      pipeline_group_(std::move(stage.pipeline_group)),
      loss_scaler_(config.fp16) {
  ZERO3_REQUIRE(comm_ != nullptr, InvalidArgument, "Engine: the communicator is null");
  rank_ = comm_->rank();
  world_ = comm_->size();
  require_resolved(config_, world_, pipeline_group_ != nullptr);
  stage_ranks_per_node_ = stage.ranks_per_node;
  const ZeroConfig& z = config_.zero;
  ZERO3_REQUIRE(z.stage >= 0 && z.stage <= 3, ConfigError, "zero_optimization.stage: ", z.stage,
                " is not a ZeRO stage (0, 1, 2 or 3)");
  ZERO3_REQUIRE(!(config_.fp16.enabled && config_.bf16.enabled), ConfigError,
                "fp16.enabled and bf16.enabled: both are true; choose one compute precision");
  config_detail::check_layouts(config_);
  config_detail::check_quantization_precision(config_);
  detect_nodes();
  // On the cpu device everything already lives in host memory, which is what offload to "cpu" asks for:
  // the optimizer step then runs the SIMD CPU Adam (cpu_adam_step) tile by tile, and the parameters need no
  // moving (an honest no-op). Optimizer offload to nvme swaps the fp32 master weights and Adam moments to a
  // per-rank file (optimizer_swap.hpp); parameter offload to nvme (stage 3, 16-bit compute) swaps the
  // compute-dtype slices (param_swap.hpp).
  // On a GPU, optimizer offload keeps the master and moments in host memory (pinned with pin_memory) or the
  // swap file, and the step brings each tile's gradients down and its compute copy back (tile_transfer.hpp);
  // parameter offload (stage 3) keeps each rank's compute-dtype slices in host memory (or the swap file) and
  // copies a slice up just before its unit's all-gather. The device keeps the gradients and the gathered units.
  const bool on_gpu = device.type() != DeviceType::cpu;
  for (const auto& [key, off] :
       {std::pair<const char*, const OffloadConfig*>{"offload_optimizer", &z.offload_optimizer},
        {"offload_param", &z.offload_param}}) {
    if (off->device == OffloadDevice::none) continue;
    const bool optimizer = off == &z.offload_optimizer;
    const char* where = off->device == OffloadDevice::cpu ? "cpu" : "nvme";
    // DeepSpeed's rule, also applied by the memory plan: offloading the optimizer needs sharded state.
    ZERO3_REQUIRE(!optimizer || z.stage >= 1, ConfigError,
                  "zero_optimization.offload_optimizer.device: offloading the optimizer needs stage 1, 2 or 3 (stage "
                  "is 0)");
    if (!optimizer && (off->device == OffloadDevice::nvme || on_gpu)) {
      ZERO3_REQUIRE(z.stage == 3, ConfigError, "zero_optimization.offload_param.device = ", where,
                    (on_gpu ? log::concat(" on device ", device.name()) : std::string()), ": needs stage 3 (stage is ",
                    z.stage, "); below it every rank holds the full parameters");
    }
    if (!optimizer && off->device == OffloadDevice::nvme && !on_gpu && config_.compute_dtype() == DType::f32) {
      throw Unsupported(
          "zero_optimization.offload_param.device = nvme with fp32 compute on the cpu device: the parameter slice is "
          "then the fp32 master the optimizer steps; swapping it is not built yet (use bf16 or fp16, or "
          "offload_param cpu)");
    }
    log::debug("engine: zero_optimization.", key, ".device = ", where, " on device ", device.name());
    if (on_gpu && !off->pin_memory) {
      log::warn_rank0("zero_optimization.", key, ".pin_memory is false: the copies between ", device.name(),
                      " and pageable host memory block the training thread until the GPU reaches them, so they do "
                      "not overlap the compute; set it to true (DeepSpeed 0.19.4 and later default to true)");
    }
    if (optimizer) {
      offload_optimizer_ = true;
      optimizer_on_host_ = on_gpu;
    } else {
      slices_on_host_ = on_gpu;
    }
  }
  if (optimizer_on_host_ || slices_on_host_) host_device_ = make_cpu_device();
  // hpZ, with parameter offload or without: the secondary partition is filled from the weights the first gather
  // after each optimizer step brings (wherever the primary slice came from: device, host memory or the NVMe swap),
  // and kept on the device, or in pinned host memory where zero3.hpz_secondary_memory says so (for a GPU whose memory
  // cannot hold it; DeepSpeed keeps it there with offload_param). On the cpu device both are host memory.
  secondary_on_host_ = layout_.kind == LayoutKind::hpz && config_.zero3.hpz_secondary_on_host && on_gpu;
  policy_.stage = z.stage;
  policy_.shard_optimizer = z.stage >= 1;
  policy_.shard_grads = z.stage >= 2;
  policy_.shard_params = z.stage >= 3;
  compute_dtype_ = config_.compute_dtype();
  acc_dtype_ = config_.grad_accum_dtype.value_or(DType::f32);
  comm_dtype_ = config_.communication_dtype();
  gas_ = *config_.gradient_accumulation_steps;  // resolved: set and consistent with the world size
  grad_divisor_ = gas_;
  if (pipeline_group_) {
    ZERO3_REQUIRE(stage.micro_batches == gas_, InvalidArgument, "Engine: a pipeline stage of ", stage.micro_batches,
                  " micro-batches per step, but gradient_accumulation_steps is ", gas_);
    gas_ = 1;  // every micro-batch of the step goes through one micro-step
    // zero3.pipeline_gradient_reduction "step": stage 2-3 accumulate the full gradients over the step's
    // micro-batches and reduce-scatter them once at the boundary.
    reduce_once_per_step_ = policy_.shard_grads && config_.zero3.pipeline_reduce_once_per_step;
  }
  overlap_ = z.overlap_comm_set ? z.overlap_comm : z.stage == 3;
  reduce_bucket_numel_ = require_set(z.reduce_bucket_size, "zero_optimization.reduce_bucket_size");
  ZERO3_REQUIRE(reduce_bucket_numel_ >= 0, ConfigError, "zero_optimization.reduce_bucket_size: ", reduce_bucket_numel_,
                " is negative, expected a number of elements (0: the largest unit)");
  schedule_policy_.prefetch_bucket_numel =
      require_set(z.prefetch_bucket_size, "zero_optimization.stage3_prefetch_bucket_size");
  schedule_policy_.max_live_numel = z.max_live_parameters;
  schedule_policy_.max_reuse_distance = z.max_reuse_distance;
  persistence_threshold_ =
      require_set(z.param_persistence_threshold, "zero_optimization.stage3_param_persistence_threshold");
  ZERO3_REQUIRE(z.sub_group_size >= 1, ConfigError, "zero_optimization.sub_group_size: ", z.sub_group_size,
                " is not a positive number of elements");
  ZERO3_REQUIRE(config_.gradient_clipping.has_value(), ConfigError,
                "gradient_clipping: is still \"auto\"; resolve the config before creating the Engine");
  ZERO3_REQUIRE(config_.gradient_predivide_factor > 0.0, ConfigError,
                "gradient_predivide_factor: ", config_.gradient_predivide_factor, " is not positive");
  adam_ = adam_hyper_from_config(config_);
  lr_scheduler_ = make_lr_scheduler(config_);
  // The device's compute stream: the caller's when the device was made with one (make_device(name, stream)).
  compute_ = device.default_stream();
  kernels_of(device);  // a Device zero3 did not make is refused here, before anything is allocated
  if (device.type() != DeviceType::cpu) {
    // Collectives on device memory: only nccl works there (gloo and local read host memory).
    ZERO3_REQUIRE(std::string_view(comm_->backend()) == "nccl", Unsupported, "Engine: device ", device.name(),
                  " needs the nccl communicator; \"", comm_->backend(), "\" works on host memory only");
    // NCCL chose its GPU from CommOptions::device or the launcher's local rank; the buffers come from `device`.
    ZERO3_REQUIRE(comm_->cuda_device() < 0 || comm_->cuda_device() == device.index(), InvalidArgument, "Engine: rank ",
                  comm_->rank(), " allocates on ", device.name(), " but its nccl communicator runs on cuda:",
                  comm_->cuda_device(), "; make the device with the communicator's GPU (make_device(\"cuda:",
                  comm_->cuda_device(), "\")) or set CommOptions::device to ", device.index());
    gather_stream_ = device.make_stream();
    reduce_stream_ = device.make_stream();
  } else {
    // And the other way round: nccl reduces GPU memory only, the cpu device's buffers are host memory.
    ZERO3_REQUIRE(std::string_view(comm_->backend()) != "nccl", Unsupported, "Engine: the cpu device needs a ",
                  "communicator over host memory (gloo, or local for one process); nccl works on GPU memory only");
  }
  // Ranks whose schedules differ must not reach a library that cannot tell (nccl: a hang or wrong bytes).
  if (world_ > 1 && !comm_->checks_collectives()) {
    auto guard = std::make_shared<CollectiveGuard>(comm_, device);
    guard_ = guard.get();
    comm_ = std::move(guard);
  }
  defer_agreement_ = world_ > 1;
  reset_events();
  // With streams, a task only enqueues its collective, so tasks run inline: overlap comes from the streams.
  queue_ = std::make_unique<CommQueue>(overlap_ && gather_stream_ == nullptr);
  log::debug("engine: stage ", z.stage, ", world ", world_, ", compute ", dtype_name(compute_dtype_), ", grads ",
             dtype_name(acc_dtype_), ", communication ", dtype_name(comm_dtype_), ", accumulation ", gas_,
             ", overlap_comm ", overlap_ ? "on" : "off");
}

EngineImpl::~EngineImpl() {
  // Let queued collectives finish before their buffers go away; a failed or timed-out one has already
  // poisoned the queue, so this does not wait on anything but the running operation.
  try {
    if (queue_ && !queue_->error()) queue_->drain();
  } catch (const std::exception& e) {
    log::warn("engine shutdown: ", e.what());
  }
  try {
    // The streams may still be reading or writing buffers that are about to be freed (with offload, host
    // buffers too, which are freed at once).
    if (gather_stream_) gather_stream_->synchronize();
    if (reduce_stream_) reduce_stream_->synchronize();
    if (optimizer_on_host_ || slices_on_host_) device_.synchronize();
  } catch (const std::exception& e) {
    log::warn("engine shutdown: ", e.what());
  }
  queue_.reset();
  // The buffers go back while the counters they report to (declared after units_) still exist.
  open_grads_.clear();
  units_.clear();
}

void EngineImpl::check_usable() {
  if (fatal_error_) std::rethrow_exception(fatal_error_);
  if (deferred_error_) {
    auto e = deferred_error_;
    deferred_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void EngineImpl::fail(std::exception_ptr error) {
  if (fatal_error_) std::rethrow_exception(error);
  fatal_error_ = explain_mismatch(error);
  std::rethrow_exception(fatal_error_);
}

void EngineImpl::require_materialized(const char* what) const {
  ZERO3_REQUIRE(materialized_, InvalidArgument, "Engine::", what, ": call materialize() first");
}

void EngineImpl::require_declaring(const char* what) const {
  ZERO3_REQUIRE(!materialized_, InvalidArgument, "Engine::", what,
                ": the model is already materialized; declare every unit and parameter before materialize()");
}

UnitState& EngineImpl::unit_state(UnitId unit, const char* what) {
  ZERO3_REQUIRE(unit.index >= 0 && static_cast<size_t>(unit.index) < units_.size(), InvalidArgument, "Engine::", what,
                ": unit id ", unit.index, " is not a declared unit (", units_.size(), " declared)");
  return units_[static_cast<size_t>(unit.index)];
}

const UnitState& EngineImpl::unit_state(UnitId unit, const char* what) const {
  return const_cast<EngineImpl*>(this)->unit_state(unit, what);
}

const ParamState& EngineImpl::param_state(ParamId param, const char* what) const {
  ZERO3_REQUIRE(param.index >= 0 && static_cast<size_t>(param.index) < params_.size(), InvalidArgument,
                "Engine::", what, ": parameter id ", param.index, " is not a declared parameter (", params_.size(),
                " declared)");
  return params_[static_cast<size_t>(param.index)];
}

ParamId EngineImpl::find_param_in_unit(UnitId unit, std::string_view local_name) const {
  const UnitState& u = unit_state(unit, "param_id");
  for (ParamId p : u.info.params) {
    if (params_[static_cast<size_t>(p.index)].info.local_name == local_name) return p;
  }
  std::string names;
  for (ParamId p : u.info.params)
    names += (names.empty() ? "" : ", ") + params_[static_cast<size_t>(p.index)].info.local_name;
  throw InvalidArgument(log::concat("unit '", u.info.name, "' has no parameter '", local_name,
                                    "' (it has: ", names.empty() ? "none" : names, ")"));
}

MemoryStats EngineImpl::memory() const {
  MemoryStats m;
  m.params = counters_.bytes(MemoryCategory::params);
  m.master = counters_.bytes(MemoryCategory::master);
  m.grads = counters_.bytes(MemoryCategory::grads);
  m.optimizer_state = counters_.bytes(MemoryCategory::optimizer_state);
  m.buffers = counters_.bytes(MemoryCategory::buffers);
  m.peak_buffers = counters_.peak(MemoryCategory::buffers);
  m.gathered = gathered_bytes_;
  m.peak_gathered = peak_gathered_bytes_;
  m.peak_total = counters_.peak_total();
  m.host_params = host_counters_.bytes(MemoryCategory::params);
  m.host_master = host_counters_.bytes(MemoryCategory::master);
  m.host_optimizer_state = host_counters_.bytes(MemoryCategory::optimizer_state);
  m.host_buffers = host_counters_.bytes(MemoryCategory::buffers);
  m.peak_host_total = host_counters_.peak_total();
  return m;
}
}  // namespace zero3::detail

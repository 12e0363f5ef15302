#include "zero/engine_impl.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string_view>

#include "config/config_checks.hpp"
#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "kernels/philox_init.hpp"
#include "zero/collective_guard.hpp"
#include "plan/gather_simulation.hpp"
#include "zero/param_fill.hpp"
#include "zero/partition.hpp"
#include "zero/persistence_log.hpp"
#include "zero/rank_agreement.hpp"
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

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Construction and declaration

EngineImpl::EngineImpl(const Config& config, std::shared_ptr<Communicator> comm, Device& device)
    : config_(config), user_comm_(std::move(comm)), comm_(user_comm_), device_(device), loss_scaler_(config.fp16) {
  ZERO3_REQUIRE(comm_ != nullptr, InvalidArgument, "Engine: the communicator is null");
  rank_ = comm_->rank();
  world_ = comm_->size();
  require_resolved(config_, world_);
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
  // hpZ's secondary partition lives on the device; for parameters that live in host memory or on NVMe it is not
  // built (DeepSpeed keeps it in host memory then).
  ZERO3_REQUIRE(layout_.kind != LayoutKind::hpz || !(slices_on_host_ || z.offload_param.device == OffloadDevice::nvme),
                Unsupported, "zero_optimization.zero_hpz_partition_size: ", z.hpz_partition_size,
                " with offload_param.device = ", z.offload_param.device == OffloadDevice::nvme ? "nvme" : "cpu",
                " on ", device.name(), ": a secondary partition of offloaded parameters is not built yet; use hpZ or "
                "parameter offload");
  policy_.stage = z.stage;
  policy_.shard_optimizer = z.stage >= 1;
  policy_.shard_grads = z.stage >= 2;
  policy_.shard_params = z.stage >= 3;
  compute_dtype_ = config_.compute_dtype();
  acc_dtype_ = config_.grad_accum_dtype.value_or(DType::f32);
  comm_dtype_ = config_.communication_dtype();
  gas_ = *config_.gradient_accumulation_steps;  // resolved: set and consistent with the world size
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
  defer_agreement_ = gather_stream_ != nullptr && world_ > 1;
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

// The ranks per node come from the launcher's variables (detect_launch(): LOCAL_WORLD_SIZE, PET_NPROC_PER_NODE,
// OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's task counts) when they describe this communicator's world; otherwise every
// rank counts as one node. The layouts that depend on the nodes need every node to run the same number of ranks,
// numbered node by node; materialize() checks that the ranks agree (agree_on_nodes).
void EngineImpl::detect_nodes() {
  const ZeroConfig& z = config_.zero;
  int per_node = world_;
  nodes_source_ = "one node: the launcher's variables do not describe this communicator's world";
  LaunchInfo launch;
  bool from_launcher = false;
  try {
    launch = detect_launch();
    from_launcher = launch.world_size == world_ && launch.rank == rank_ && world_ > 1;
  } catch (const Error& e) {
    nodes_source_ = log::concat("one node: the launcher's variables are unreadable (", e.what(), ")");
  }
  if (from_launcher) {
    const int l = launch.local_world_size;
    launch_node_ = launch.node_rank;
    launch_local_size_ = l;
    nodes_source_ = log::concat("the launcher (", launch.launcher, ") puts rank ", rank_, " on node ",
                                launch.node_rank, " with ", l, " rank", l == 1 ? "" : "s", " as local rank ",
                                launch.local_rank);
    // Uneven nodes: one node for now; materialize() tells every rank at once (agree_on_nodes).
    launch_consistent_ = l >= 1 && world_ % l == 0 && launch.node_rank == rank_ / l && launch.local_rank == rank_ % l;
    if (launch_consistent_) per_node = l;
  }
  nodes_ = make_node_layout(world_, per_node, nodes_source_);
  layout_ = make_shard_layout(z, nodes_);
  if (z.stage == 3 && z.hpz_partition_size >= world_ && world_ > 1) {
    log::info_rank0("zero_optimization.zero_hpz_partition_size ", z.hpz_partition_size, " covers the whole world of ",
                    world_, " ranks: a secondary partition over every rank would gather like the primary one, so hpZ "
                    "is off (DeepSpeed takes min(", z.hpz_partition_size, ", ", world_, "))");
  }
}

// Collective: every rank must see the same ranks per node, else the groups would differ between ranks.
void EngineImpl::agree_on_nodes() {
  if (world_ == 1) return;
  std::vector<float> mine{static_cast<float>(nodes_.ranks_per_node), launch_consistent_ ? 1.0f : 0.0f};
  if (ranks_agree(*queue_, *comm_, mine, "materialize: comparing the ranks per node", &device_) &&
      launch_consistent_) {
    return;
  }
  auto all = gather_from_ranks(*queue_, *comm_, {launch_node_, launch_local_size_},
                               "materialize: exchanging the nodes", &device_);
  std::map<std::pair<int64_t, int64_t>, std::vector<int>> by_node;
  for (int r = 0; r < world_; ++r) {
    const auto& v = all[static_cast<size_t>(r)];
    by_node[{v[0], v[1]}].push_back(r);
  }
  std::string detail;
  for (const auto& [node, ranks] : by_node) {
    detail += log::concat(detail.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks),
                          " on node ", node.first, " of ", node.second, node.second == 1 ? " rank" : " ranks");
  }
  const std::string text = log::concat("the launcher's nodes are uneven (world of ", world_, " ranks: ", detail, ")");
  const ZeroConfig& z = config_.zero;
  if (layout_.kind != LayoutKind::plain) {
    const bool mics = layout_.kind == LayoutKind::mics;
    throw ConfigError(log::concat(mics ? "zero_optimization.mics_shard_size: "
                                       : "zero_optimization.zero_hpz_partition_size: ",
                                  mics ? z.mics_shard_size : z.hpz_partition_size,
                                  " needs every node to run the same number of ranks, numbered node by node; ",
                                  text));
  }
  log::warn_rank0(text, "; the engine counts every rank as one node (ScheduleStats' inter-node traffic is then 0)");
  nodes_ = make_node_layout(world_, world_, "one node: the launcher's nodes are uneven");
  layout_ = make_shard_layout(config_.zero, nodes_);
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

UnitId EngineImpl::add_unit(const std::string& name) {
  require_declaring("add_unit");
  ZERO3_REQUIRE(!name.empty() && name.find('/') == std::string::npos, InvalidArgument, "Engine::add_unit: \"", name,
                "\" is not a unit name (non-empty, no '/')");
  ZERO3_REQUIRE(!unit_by_name_.count(name), InvalidArgument, "Engine::add_unit: unit '", name, "' is already declared");
  UnitState u;
  u.info.id = UnitId{static_cast<int32_t>(units_.size())};
  u.info.name = name;
  u.info.dtype = compute_dtype_;
  unit_by_name_[name] = u.info.id.index;
  units_.push_back(std::move(u));
  return units_.back().info.id;
}

ParamId EngineImpl::add_param(UnitId unit, const ParamSpec& spec) {
  require_declaring("add_param");
  UnitState& u = unit_state(unit, "add_param");
  ZERO3_REQUIRE(!spec.name.empty() && spec.name.find('/') == std::string::npos, InvalidArgument,
                "Engine::add_param: \"", spec.name, "\" is not a parameter name for unit '", u.info.name,
                "' (non-empty, no '/')");
  std::string full = u.info.name + "." + spec.name;
  ZERO3_REQUIRE(!param_by_name_.count(full), InvalidArgument, "Engine::add_param: parameter '", full,
                "' is already declared");
  int64_t numel = 1;
  for (int64_t d : spec.shape) {
    ZERO3_REQUIRE(d >= 1, InvalidArgument, "Engine::add_param: parameter '", full, "' has shape ",
                  shape_string(spec.shape), "; every dimension must be >= 1");
    ZERO3_REQUIRE(numel <= (int64_t{1} << 50) / d, InvalidArgument, "Engine::add_param: parameter '", full,
                  "' with shape ", shape_string(spec.shape), " is too large");
    numel *= d;
  }
  DType dtype = spec.dtype.value_or(compute_dtype_);
  if (u.info.params.empty()) {
    u.info.dtype = dtype;
  } else {
    ZERO3_REQUIRE(dtype == u.info.dtype, InvalidArgument, "Engine::add_param: parameter '", full, "' is ",
                  dtype_name(dtype), " but unit '", u.info.name, "' holds ", dtype_name(u.info.dtype),
                  " parameters; a unit has one dtype: put '", spec.name, "' in a unit of its own");
  }
  if (spec.init.kind() == ParamInit::Kind::reader) {
    ZERO3_REQUIRE(static_cast<bool>(spec.init.reader()), InvalidArgument, "Engine::add_param: parameter '", full,
                  "' has a from_reader init with an empty function");
  }
  ParamState p;
  p.info.id = ParamId{static_cast<int32_t>(params_.size())};
  p.info.unit = unit;
  p.info.name = full;
  p.info.local_name = spec.name;
  p.info.shape = spec.shape;
  p.info.numel = numel;
  p.info.offset = u.info.numel;
  p.info.dtype = dtype;
  p.init = spec.init;
  u.info.params.push_back(p.info.id);
  u.param_offsets.push_back(p.info.offset);
  u.param_numels.push_back(numel);
  u.info.numel += numel;
  param_by_name_[full] = p.info.id.index;
  params_.push_back(std::move(p));
  return params_.back().info.id;
}

// ---------------------------------------------------------------------------------------------------------
// Materialization

void EngineImpl::check_declarations_agree() {
  // One hash per unit over its name and its parameters' names, shapes and dtypes; then one for the model.
  std::vector<uint64_t> unit_hashes;
  uint64_t model = fnv1a("zero3-model", 11);
  for (const UnitState& u : units_) {
    uint64_t h = fnv1a(u.info.name.data(), u.info.name.size());
    for (ParamId pid : u.info.params) {
      const ParamInfo& p = params_[static_cast<size_t>(pid.index)].info;
      h = fnv1a(p.local_name.data(), p.local_name.size(), h);
      h = fnv1a(p.shape.data(), p.shape.size() * sizeof(int64_t), h);
      h = fnv1a(&p.dtype, sizeof(p.dtype), h);
    }
    unit_hashes.push_back(h);
    model = fnv1a(&h, sizeof h, model);
  }
  if (ranks_agree(*queue_, *comm_, hash_to_floats(model), "materialize: comparing the model declarations", &device_)) {
    return;
  }

  std::vector<int64_t> mine;
  for (uint64_t h : unit_hashes) {
    for (float f : hash_to_floats(h)) mine.push_back(static_cast<int64_t>(f));
  }
  auto all = gather_from_ranks(*queue_, *comm_, mine, "materialize: exchanging the model declarations", &device_);
  size_t longest = 0;
  for (const auto& v : all) longest = std::max(longest, v.size());
  for (size_t k = 0; k < longest / 3; ++k) {
    std::map<std::vector<int64_t>, std::vector<int>> groups;
    for (int r = 0; r < world_; ++r) {
      const auto& v = all[static_cast<size_t>(r)];
      std::vector<int64_t> key;
      if (v.size() >= 3 * (k + 1)) key.assign(v.begin() + 3 * k, v.begin() + 3 * (k + 1));
      groups[key].push_back(r);
    }
    if (groups.size() == 1) continue;
    std::string detail;
    for (const auto& [key, ranks] : groups) {
      detail += log::concat(detail.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks),
                            key.empty() ? ": no such unit" : ": one declaration");
    }
    std::string here = k < units_.size()
                           ? log::concat("'", units_[k].info.name, "' with ", units_[k].info.params.size(),
                                         " parameters, ", units_[k].info.numel, " elements")
                           : std::string("no unit");
    fail(std::make_exception_ptr(
        CommError(log::concat("materialize: the ranks declared different models. Unit #", k, " differs (this is rank ",
                              rank_, ", which has ", here, "): ", detail,
                              ". Every rank must declare the same units and parameters (names, shapes, dtypes) in "
                              "the same order"))));
  }
  fail(std::make_exception_ptr(
      CommError("materialize: the ranks declared different models (the declarations hash differently)")));
}

void EngineImpl::materialize() {
  check_usable();
  require_declaring("materialize");
  ZERO3_REQUIRE(!units_.empty(), InvalidArgument, "Engine::materialize: no unit was declared");
  ZERO3_REQUIRE(4 * static_cast<int64_t>(units_.size()) + 3 < kMaxExactFloatInt, InvalidArgument,
                "Engine::materialize: ", units_.size(), " units are more than the engine supports (4 million)");
  for (const UnitState& u : units_) {
    ZERO3_REQUIRE(u.info.numel > 0, InvalidArgument, "Engine::materialize: unit '", u.info.name, "' has no parameters");
  }
  try {
    agree_on_nodes();
    groups_ = make_process_groups(comm_, layout_, config_.zero.quantized_gradients && policy_.shard_grads);
    check_declarations_agree();
  } catch (...) {
    fail(std::current_exception());
  }

  // Persistence (stage 3): small units stay gathered, in declaration order, up to the model-wide cap.
  int64_t persistent_total = 0;
  std::vector<int64_t> numels;
  std::vector<bool> persistent;
  int64_t total_slice = 0, total_numel = 0, largest_slice = 0, largest_numel = 0;
  // Slices of the partition: over every rank, or under MiCS over the shard group (replicated across the groups).
  const int partition = partition_size();
  for (UnitState& u : units_) {
    u.info.slice_numel = slice_numel(u.info.numel, partition);
    largest_slice = std::max(largest_slice, u.info.slice_numel);
    largest_numel = std::max(largest_numel, u.info.numel);
    u.info.padded_numel = u.info.slice_numel * partition;
    u.flat_shape = {u.info.numel};
    bool keep = policy_.shard_params && u.info.numel <= persistence_threshold_ &&
                persistent_total + u.info.numel <= config_.zero.model_persistence_threshold;
    if (keep) persistent_total += u.info.numel;
    u.info.persistent = keep;
    numels.push_back(u.info.numel);
    persistent.push_back(keep);
    total_slice += u.info.slice_numel;
    total_numel += u.info.numel;
  }
  if (policy_.shard_params) {
    log_persistence(units_, persistence_threshold_, config_.zero.model_persistence_threshold, world_);
  }
  schedule_ = std::make_unique<Schedule>(schedule_policy_, numels, persistent);
  eval_schedule_ = std::make_unique<Schedule>(schedule_policy_, numels, persistent);

  ReducerOptions ro;
  ro.mode = policy_.shard_grads ? ReduceMode::reduce_scatter : ReduceMode::all_reduce;
  ro.comm_dtype = comm_dtype_;
  ro.acc_dtype = acc_dtype_;
  // reduce_bucket_size 0: DeepSpeed reduces each parameter's gradient on its own; here a bucket holds the
  // largest unit.
  ro.bucket_numel = reduce_bucket_numel_ > 0 ? reduce_bucket_numel_
                    : policy_.shard_grads    ? largest_slice * partition_size()
                                             : largest_numel;
  ro.max_useful_numel = policy_.shard_grads ? total_slice : total_numel;
  ro.largest_unit_numel = policy_.shard_grads ? largest_slice * partition_size() : largest_numel;
  // DeepSpeed's averaging: each micro-step's gradient counts 1/gradient_accumulation_steps; over ranks,
  // prescale_gradients divides before the sum, otherwise gradient_predivide_factor is divided out before
  // and the rest of 1/world after it.
  const double inv_gas = 1.0 / static_cast<double>(gas_);
  if (config_.prescale_gradients) {
    ro.pre_scale = static_cast<float>(inv_gas / world_);
    ro.post_scale = 1.0f;
  } else {
    double f = config_.gradient_predivide_factor;
    ro.pre_scale = static_cast<float>(inv_gas / f);
    ro.post_scale = static_cast<float>(f / world_);
  }
  ro.stream = reduce_stream_ ? reduce_stream_->get() : nullptr;
  ro.link = groups_.shard.link;
  ro.group = groups_.shard.label;
  ro.traffic = &stats_.reduce_traffic;
  if (groups_.qgz_intra) {
    // qgZ: the two-stage int4 all-to-all over the shard group (a stage of one rank is skipped).
    ro.quantized = true;
    ro.format = QuantFormat{4, config_.zero3.qgz_block_size};
    if (groups_.qgz_intra.ranks.size() > 1) ro.intra = groups_.qgz_intra.comm.get();
    if (groups_.qgz_inter.ranks.size() > 1) ro.inter = groups_.qgz_inter.comm.get();
    ro.intra_link = groups_.qgz_intra.link;
    ro.inter_link = groups_.qgz_inter.link;
  }
  reducer_ = std::make_unique<Reducer>(ro, device_, counters_, *groups_.shard.comm, *queue_);
  if (groups_.replica) {
    // MiCS: at the boundary the shard groups' sums (already scaled by 1/W) are summed across the replicas,
    // unquantized (DeepSpeed's MiCS all-reduce is not quantized either).
    ReducerOptions rr = ro;
    rr.quantized = false;
    rr.mode = ReduceMode::all_reduce;
    rr.pre_scale = rr.post_scale = 1.0f;
    rr.link = groups_.replica.link;
    rr.largest_unit_numel = largest_slice;
    rr.group = groups_.replica.label;
    replica_reducer_ = std::make_unique<Reducer>(rr, device_, counters_, *groups_.replica.comm, *queue_);
  }

  // The swap files come first (preflight: IoError/ConfigError naming nvme_path, before anything is
  // allocated); then each unit is allocated, initialised, given its compute copies and, with NVMe, spilled,
  // one unit at a time, so that no more than one unit's state is ever resident beyond what stays.
  int64_t largest_owned = 0;
  size_t largest_copy = 0;
  for (UnitState& u : units_) {
    set_owned_range(u);
    largest_owned = std::max(largest_owned, u.owned_len);
    largest_copy = std::max(largest_copy, dtype_size(u.info.dtype));
  }
  if (config_.zero.offload_optimizer.device == OffloadDevice::nvme) {
    std::vector<int64_t> lens;
    for (const UnitState& u : units_) lens.push_back(u.owned_len);
    opt_swap_ = std::make_unique<OptimizerSwap>(config_, rank_, lens);
  }
  if (config_.zero.offload_param.device == OffloadDevice::nvme) {
    std::vector<size_t> bytes;
    for (const UnitState& u : units_)
      bytes.push_back(static_cast<size_t>(u.info.slice_numel) * dtype_size(u.info.dtype));
    param_swap_ = std::make_unique<ParamSwap>(config_, rank_, bytes, dtype_size(compute_dtype_));
    param_reads_ =
        std::make_unique<ParamPrefetcher>(*param_swap_, static_cast<size_t>(config_.zero.offload_param.buffer_count));
  }
  if (optimizer_on_host_) {
    // Compute copies go back to the device unless the slices live in host memory, where Adam writes them.
    const int64_t tile = std::max<int64_t>(1, std::min(config_.zero.sub_group_size, largest_owned));
    transfer_ = std::make_unique<TileTransfer>(device_, kernels_of(*host_device_), host_counters_, acc_dtype_,
                                               slices_on_host_ ? 0 : largest_copy, tile);
  }
  try {
    for (UnitState& u : units_) {
      allocate_and_init(u);
      build_compute_copies(u);
      if (opt_swap_) spill_optimizer_state(u);
    }
    queue_->drain();
  } catch (...) {
    fail(std::current_exception());
  }
  materialized_ = true;
  log::debug("engine: materialized ", units_.size(), " units, ", params_.size(), " parameters, ", total_numel,
             " elements; this rank holds ", counters_.total(), " bytes");
}

void EngineImpl::set_owned_range(UnitState& u) {
  if (policy_.shard_optimizer) {
    u.owned_begin = static_cast<int64_t>(layout_.shard_rank(rank_)) * u.info.slice_numel;
    u.owned_len = u.info.slice_numel;
  } else {
    u.owned_begin = 0;
    u.owned_len = u.info.padded_numel;
  }
  u.owned_valid = std::clamp<int64_t>(u.info.numel - u.owned_begin, 0, u.owned_len);
}

bool EngineImpl::master_is_param(const UnitState& u) const {
  // fp32 compute with the optimizer and the parameters in one place: the master array is the parameter.
  return u.info.dtype == DType::f32 && !optimizer_on_host_ && !slices_on_host_;
}

HostMemory EngineImpl::host_memory(const OffloadConfig& off) const {
  return off.pin_memory ? HostMemory::pinned : HostMemory::pageable;
}

void EngineImpl::allocate_and_init(UnitState& u) {
  const int64_t S = u.info.slice_numel;
  const int64_t P = u.info.padded_numel;
  const DType ct = u.info.dtype;
  const size_t owned_bytes = static_cast<size_t>(u.owned_len) * sizeof(float);

  if (!policy_.shard_params) {
    u.full = DeviceBuffer(device_, counters_, MemoryCategory::params, P * dtype_size(ct));
  }
  if (master_is_param(u) && !policy_.shard_params) {
    // fp32 compute at stage 0-2: the parameters are the master weights; the owned range lives in `full`.
    u.master = u.full.as<float>() + u.owned_begin;
  } else if (optimizer_on_host_) {
    u.host_master = HostBuffer(device_, host_memory(config_.zero.offload_optimizer), host_counters_,
                               MemoryCategory::master, owned_bytes);
    u.master = u.host_master.as<float>();
  } else {
    u.master_buf = DeviceBuffer(device_, counters_,
                                master_is_param(u) ? MemoryCategory::params : MemoryCategory::master, owned_bytes);
    u.master = u.master_buf.as<float>();
  }
  if (policy_.shard_params && !master_is_param(u) && !param_swap_) {
    // (With NVMe the slice lives in the swap file: new_compute_slice, claim_param_slice.)
    if (slices_on_host_) {
      u.host_slice = HostBuffer(device_, host_memory(config_.zero.offload_param), host_counters_,
                                MemoryCategory::params, S * dtype_size(ct));
    } else {
      u.compute_slice = DeviceBuffer(device_, counters_, MemoryCategory::params, S * dtype_size(ct));
    }
  }
  if (optimizer_on_host_) {
    const HostMemory kind = host_memory(config_.zero.offload_optimizer);
    u.host_exp_avg = HostBuffer(device_, kind, host_counters_, MemoryCategory::optimizer_state, owned_bytes);
    u.host_exp_avg_sq = HostBuffer(device_, kind, host_counters_, MemoryCategory::optimizer_state, owned_bytes);
    u.exp_avg = u.host_exp_avg.as<float>();
    u.exp_avg_sq = u.host_exp_avg_sq.as<float>();
    host_device_->fill_zero(u.exp_avg, owned_bytes);
    host_device_->fill_zero(u.exp_avg_sq, owned_bytes);
  } else {
    u.exp_avg_buf = DeviceBuffer(device_, counters_, MemoryCategory::optimizer_state, owned_bytes);
    u.exp_avg_sq_buf = DeviceBuffer(device_, counters_, MemoryCategory::optimizer_state, owned_bytes);
    u.exp_avg = u.exp_avg_buf.as<float>();
    u.exp_avg_sq = u.exp_avg_sq_buf.as<float>();
    device_.fill_zero(u.exp_avg, owned_bytes);
    device_.fill_zero(u.exp_avg_sq, owned_bytes);
  }
  if (groups_.hpz && !u.info.persistent) {
    u.secondary = DeviceBuffer(device_, counters_, MemoryCategory::params, P / layout_.hpz_size * dtype_size(ct));
  }
  int64_t acc_numel = policy_.shard_grads ? S : P;
  u.grad_acc = DeviceBuffer(device_, counters_, MemoryCategory::grads, acc_numel * dtype_size(acc_dtype_));
  device_.fill_zero(u.grad_acc.data(), u.grad_acc.bytes());
  init_owned_range(u);
}

void EngineImpl::init_owned_range(UnitState& u) {
  // The master is initialised where it lives (with optimizer offload on a GPU, by the cpu kernels: the same
  // single-source Philox fill as the GPU's).
  Device& where = optimizer_on_host_ ? *host_device_ : device_;
  where.fill_zero(u.master, static_cast<size_t>(u.owned_len) * sizeof(float));
  auto& k = kernels_of(where);
  const uint64_t seed = config_.zero3.seed;
  for (const ParamRange& r : params_in_range(u.param_offsets, u.param_numels, u.owned_begin, u.owned_len)) {
    const ParamState& p = params_[static_cast<size_t>(u.info.params[static_cast<size_t>(r.param_index)].index)];
    float* out = u.master + r.local_offset;
    if (p.init.kind() != ParamInit::Kind::reader) {
      k.init_fill(out, param_fill(p.init), seed, philox_stream_id(p.info.name), r.param_begin, r.param_end);
      continue;
    }
    // The reader writes host memory; on the cpu device (or with the master in host memory) that is the master.
    std::vector<float> host;
    float* dst = out;
    if (where.type() != DeviceType::cpu) {
      host.resize(static_cast<size_t>(r.param_end - r.param_begin));
      dst = host.data();
    }
    try {
      p.init.reader()(r.param_begin, r.param_end, dst);
    } catch (const Error& e) {
      throw Error(log::concat("materialize: reading the initial values of parameter '", p.info.name, "' elements [",
                              r.param_begin, ", ", r.param_end, ") on rank ", rank_, " failed: ", e.what()));
    }
    if (!host.empty()) device_.copy(out, host.data(), host.size() * sizeof(float));
  }
}

void EngineImpl::spill_optimizer_state(UnitState& u) {
  // NVMe optimizer offload: the unit's initial state goes to the swap file and leaves memory. An fp32 master
  // that is also the parameter (cpu device) stays, as a copy the step refreshes.
  const size_t i = static_cast<size_t>(u.info.id.index);
  opt_swap_->write_unit(i, u.master, u.exp_avg, u.exp_avg_sq);
  u.exp_avg_buf = DeviceBuffer();
  u.exp_avg_sq_buf = DeviceBuffer();
  u.host_exp_avg = HostBuffer();
  u.host_exp_avg_sq = HostBuffer();
  u.exp_avg = nullptr;
  u.exp_avg_sq = nullptr;
  if (!master_is_param(u)) {
    u.master_buf = DeviceBuffer();
    u.host_master = HostBuffer();
    u.master = nullptr;
  }
}

bool EngineImpl::slice_swapped(const UnitState& u) const { return param_swap_ && !master_is_param(u); }

void EngineImpl::new_compute_slice(UnitState& u) {
  // A zeroed slice for the step or refresh_params() to write (the padding stays zero), then store_compute_slice.
  const size_t bytes = static_cast<size_t>(u.info.slice_numel) * dtype_size(u.info.dtype);
  if (slices_on_host_) {
    if (u.host_slice.allocated()) return;
    u.host_slice =
        HostBuffer(device_, host_memory(config_.zero.offload_param), host_counters_, MemoryCategory::params, bytes);
    host_device_->fill_zero(u.host_slice.data(), bytes);
    return;
  }
  if (u.compute_slice.data() != nullptr) return;
  u.compute_slice = DeviceBuffer(device_, counters_, MemoryCategory::params, bytes);
  device_.fill_zero(u.compute_slice.data(), u.compute_slice.bytes());
}

void EngineImpl::step_slice_for(UnitState* u) {
  if (!param_swap_ || u == step_slice_) return;
  if (step_slice_ != nullptr) {
    // The optimizer on a GPU copied the slice down on the compute stream.
    if (slices_on_host_ && !optimizer_on_host_) wait_for_device_writes();
    store_compute_slice(*step_slice_);
    step_slice_ = nullptr;
  }
  if (u != nullptr && slice_swapped(*u)) {
    new_compute_slice(*u);
    step_slice_ = u;
  }
}

void EngineImpl::store_compute_slice(UnitState& u) {
  const size_t idx = static_cast<size_t>(u.info.id.index);
  // A read of the old slice started ahead must not feed a later gather.
  param_reads_->discard(idx);
  if (slices_on_host_) {
    before_host_slice_write(u);  // no copy out of it may still be queued when it is freed
    param_swap_->write(idx, u.host_slice.data());
    u.host_slice = HostBuffer();
    return;
  }
  param_swap_->write(idx, u.compute_slice.data());
  u.compute_slice = DeviceBuffer();
}

void EngineImpl::before_host_slice_write(UnitState& u) {
  // The gather stream may still be copying the slice up for the unit's last all-gather. At the boundary the host
  // has usually waited past it already (the statistics' read follows the compute stream's wait for every gather),
  // which the event's query tells without waiting.
  if (u.slice_read && !u.slice_read->done()) u.slice_read->synchronize();
}

void EngineImpl::write_compute_copy(void* dst, bool dst_on_host, DType dtype, const float* src, bool src_on_host,
                                    int64_t n) {
  if (n <= 0) return;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  if (dst_on_host == src_on_host) {
    DeviceKernels& k = src_on_host && host_device_ ? kernels_of(*host_device_) : kernels_of(device_);
    k.scale_copy(dst, dtype, src, DType::f32, 1.0f, n);
    return;
  }
  if (dtype == DType::f32) {
    device_.copy(dst, src, bytes);
    return;
  }
  // Converted where the master is, then copied (synchronously) to the other side.
  if (src_on_host) {
    std::vector<std::byte> converted(bytes);
    kernels_of(*host_device_).scale_copy(converted.data(), dtype, src, DType::f32, 1.0f, n);
    device_.copy(dst, converted.data(), bytes);
  } else {
    DeviceBuffer converted(device_, counters_, MemoryCategory::buffers, bytes);
    kernels_of(device_).scale_copy(converted.data(), dtype, src, DType::f32, 1.0f, n);
    device_.copy(dst, converted.data(), bytes);
  }
}

void EngineImpl::build_compute_copies(UnitState& u, const float* master) {
  const DType ct = u.info.dtype;
  if (master == nullptr) master = u.master;
  if (policy_.shard_params) {
    if (!master_is_param(u)) {
      if (param_swap_) new_compute_slice(u);
      if (slices_on_host_) {
        before_host_slice_write(u);
        write_compute_copy(u.host_slice.data(), true, ct, master, optimizer_on_host_, u.owned_len);
      } else {
        write_compute_copy(u.compute_slice.data(), false, ct, master, optimizer_on_host_, u.owned_len);
      }
      if (param_swap_) store_compute_slice(u);
    }
    if (u.info.persistent) {
      issue_gather(u, false);
      wait_gather(u);
    }
    return;
  }
  if (!master_is_param(u)) {
    write_compute_copy(element_ptr(u.full.data(), ct, u.owned_begin), false, ct, master, optimizer_on_host_,
                       u.owned_len);
  }
  if (policy_.shard_optimizer) publish_params(u);
}

// ---------------------------------------------------------------------------------------------------------
// Schedule agreement. Every scope entry and exit is an event; each micro-step (evaluation batch) keeps its
// events and their running hash, and step() (EvalMode::next_batch()) compares the hash across ranks before it
// does anything else, so the optimizer never applies gradients reduced in another rank's order. A collective
// that already differs in the middle of the micro-step (another unit's all-gather) is caught by the
// communicator (Gloo) or the CollectiveGuard (nccl) before it moves data. Either way the ranks then exchange
// their events, and the error names the first one that differs. During the first micro-step, and every one
// with zero3.check_schedule_every_step, each entry is also compared before anything is issued for it.

bool EngineImpl::checking_order() const {
  const int64_t done = evaluating_ ? eval_batches_ : local_micro_steps_;
  return world_ > 1 && (done == 0 || config_.zero3.check_schedule_every_step);
}

void EngineImpl::record_event(int64_t code) {
  events_.push_back(code);
  events_hash_ = fnv1a(&code, sizeof code, events_hash_);
}

void EngineImpl::reset_events() {
  events_.clear();
  events_hash_ = fnv1a("zero3-schedule", 14);
}

int64_t EngineImpl::event_code(UnitId unit, Phase phase, bool closing) const {
  return 1 + 4 * static_cast<int64_t>(unit.index) + (closing ? 2 : 0) + (phase == Phase::backward ? 1 : 0);
}

int64_t EngineImpl::step_code() const { return 1 + 4 * static_cast<int64_t>(units_.size()); }

std::string EngineImpl::describe_code(int64_t code) const {
  if (code < 0) return "had no more events";
  if (code == step_code()) return "called step()";
  const int64_t u = (code - 1) / 4;
  const int64_t kind = (code - 1) % 4;
  const std::string name =
      u >= 0 && static_cast<size_t>(u) < units_.size() ? units_[static_cast<size_t>(u)].info.name : "?";
  const char* scope = kind % 2 == 1 ? "backward_scope" : "forward_scope";
  return log::concat(kind >= 2 ? "closed " : "called ", scope, "('", name, "')");
}

std::string EngineImpl::schedule_position() const {
  return evaluating_ ? log::concat("evaluation batch ", eval_batches_, " (after optimizer step ", global_steps_, ")")
                     : log::concat("micro-step ", micro_steps_, " (optimizer step ", global_steps_, ")");
}

std::string EngineImpl::divergence_message(const std::vector<std::vector<int64_t>>& all,
                                           const std::string& where) const {
  size_t longest = 0;
  for (const auto& h : all) longest = std::max(longest, h.size());
  for (size_t i = 0; i < longest; ++i) {
    std::map<int64_t, std::vector<int>> groups;
    for (int r = 0; r < world_; ++r) {
      const auto& h = all[static_cast<size_t>(r)];
      groups[i < h.size() ? h[i] : -1].push_back(r);
    }
    if (groups.size() == 1) continue;
    std::string detail;
    for (const auto& [c, ranks] : groups) {
      detail += log::concat(detail.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks), " ",
                            describe_code(c));
    }
    return log::concat("the ranks entered units in different orders at scope event ", i, " of ",
                       where.empty() ? schedule_position() : where, ": ", detail,
                       ". Every rank must open and close the same unit scopes in the same order (the collectives of "
                       "ZeRO depend on it); this is rank ",
                       rank_, ".");
  }
  return "";
}

bool EngineImpl::ranks_hold(const std::vector<float>& mine, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const bool same = ranks_agree(*queue_, *comm_, mine, what, &device_);
  stats_.agreement_checks++;
  stats_.agreement_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return same;
}

void EngineImpl::check_order(int64_t code, const std::string& doing) {
  std::vector<float> mine{static_cast<float>(code)};
  if (ranks_hold(mine, "schedule check before " + doing + " in " + schedule_position())) return;
  std::vector<int64_t> history = events_;
  history.push_back(code);
  auto all = gather_from_ranks(*queue_, *comm_, history,
                               "schedule check: exchanging the events of " + schedule_position(), &device_);
  std::string message = divergence_message(all);
  if (message.empty()) message = log::concat("the ranks disagree on the order of units in ", schedule_position());
  throw CommError(message);
}

void EngineImpl::verify_schedule(const std::string& doing) {
  if (world_ == 1) return;
  std::vector<float> mine = hash_to_floats(events_hash_);
  mine.push_back(static_cast<float>(events_.size() % (kMaxExactFloatInt / 2)));
  const std::string where = schedule_position();
  if (ranks_hold(mine, "schedule agreement at " + doing + " in " + where)) return;
  auto all =
      gather_from_ranks(*queue_, *comm_, events_, "schedule agreement: exchanging the events of " + where, &device_);
  std::string message = divergence_message(all);
  if (message.empty()) {
    message = log::concat("the ranks' scope events of ", where, " hash differently (rank ", rank_, ")");
  }
  throw CommError(message);
}

std::exception_ptr EngineImpl::explain_mismatch(std::exception_ptr error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveMismatchError& mismatch) {
    // Every rank found the difference at the same collective and issued nothing after it (the queue is
    // poisoned), so the communicator is in step for one more exchange, run here outside the queue.
    try {
      CommQueue exchange(false);
      auto all = gather_from_ranks(exchange, *comm_, events_,
                                   "schedule agreement: exchanging the events of " + schedule_position(), &device_);
      std::string message = divergence_message(all);
      if (!message.empty()) {
        return std::make_exception_ptr(
            CommError(log::concat(message, " (Found when the ranks' collectives differed: ", mismatch.what(), ")")));
      }
    } catch (const std::exception& e) {
      log::warn("after the ranks' collectives differed, exchanging their scope events failed: ", e.what());
    }
    return error;
  } catch (...) {
    return error;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Gathers (stage 3)

// NVMe parameter offload: the unit's slice from its read, started ahead along the schedule or now; the
// training thread waits only for the rest of that read. On the cpu device the all-gather reads the buffer
// itself (released in wait_gather); on a GPU the slice goes to host_slice (pinned with pin_memory) for the
// asynchronous copy up, and the buffer is free at once. Called before anything of the gather is allocated or
// counted, so that a failed read leaves the unit released.
const void* EngineImpl::claim_param_slice(UnitState& u) {
  const size_t idx = static_cast<size_t>(u.info.id.index);
  // Every buffer feeds an all-gather in flight (more gathers ahead than buffer_count): the oldest completes.
  while (!param_reads_->can_claim(idx)) {
    const size_t oldest = param_reads_->claimed_units().front();
    if (units_[oldest].gather == GatherState::in_flight) {
      wait_gather(units_[oldest]);  // releases the buffer
    } else {
      param_reads_->release(oldest);
    }
  }
  ParamPrefetcher::Claim claim;
  try {
    claim = param_reads_->claim(idx);
  } catch (const IoError& e) {
    // This rank cannot issue the gather the other ranks issue: the engine is failed from here on.
    fail(std::make_exception_ptr(
        IoError(log::concat("all_gather of unit '", u.info.name, "' on rank ", rank_,
                            ": reading its parameter slice from the NVMe swap failed: ", e.what()))));
  }
  stats_.param_reads++;
  if (claim.read_ahead) stats_.param_reads_ahead++;
  stats_.param_read_wait_seconds += claim.wait_seconds;
  if (!slices_on_host_) return claim.data;
  const size_t bytes = param_swap_->slice_bytes(idx);
  u.host_slice =
      HostBuffer(device_, host_memory(config_.zero.offload_param), host_counters_, MemoryCategory::params, bytes);
  std::memcpy(u.host_slice.data(), claim.data, bytes);
  param_reads_->release(idx);
  return u.host_slice.data();
}

// The buffers not feeding gathers hold reads of the next units in the recorded order that will need one (not
// gathered by then). A nearer unit takes the buffer of a finished read of a unit further ahead; a read still in
// flight is never waited for here.
void EngineImpl::prefetch_param_reads() {
  // Reads ahead follow the prefetch switch of the gathers (stage3_prefetch_bucket_size 0: none).
  if (!param_reads_ || schedule_policy_.prefetch_bucket_numel <= 0) return;
  const size_t room = param_reads_->buffer_count() - param_reads_->claimed_units().size();
  if (room == 0) return;
  const std::vector<UnitId> next = schedule_->plan_reads(room, [this](UnitId id) {
    const UnitState& o = units_[static_cast<size_t>(id.index)];
    if (!slice_swapped(o)) return false;
    if (o.gather == GatherState::released) return true;
    // A unit in an open scope is released when it closes unless kept for its next use; others that are
    // gathered (ahead, or kept) stay until they are entered.
    return o.open_scopes > 0 && !schedule_->keep_for_reuse(o.info.id);
  });
  std::vector<bool> wanted(units_.size(), false);
  for (UnitId id : next) wanted[static_cast<size_t>(id.index)] = true;
  for (UnitId id : next) {
    const auto idx = static_cast<size_t>(id.index);
    if (param_reads_->holds(idx)) continue;
    if (param_reads_->free_buffers() == 0) {
      const std::vector<size_t> reading = param_reads_->reading_units();
      auto spare = std::find_if(reading.rbegin(), reading.rend(),
                                [&](size_t r) { return !wanted[r] && param_reads_->read_done(r); });
      if (spare == reading.rend()) return;
      param_reads_->discard(*spare);
    }
    param_reads_->start(idx);
  }
}

// One unit's all-gather: over the partition's group (every rank, or the MiCS shard group), in two stages for MiCS's
// hierarchical gather (between the nodes into gather_scratch, then within each node), or under hpZ from the
// secondary partition within the hpZ group once the first gather after the optimizer step has filled it.
void EngineImpl::issue_gather(UnitState& u, bool prefetch) {
  const DType ct = u.info.dtype;
  const size_t es = dtype_size(ct);
  const int64_t S = u.info.slice_numel, P = u.info.padded_numel;
  const bool from_secondary = u.secondary.allocated() && u.secondary_valid;
  const void* swapped_slice = !from_secondary && slice_swapped(u) ? claim_param_slice(u) : nullptr;
  u.full = DeviceBuffer(device_, counters_, MemoryCategory::params, P * es);
  gathered_bytes_ += static_cast<int64_t>(u.full.bytes());
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  if (!u.info.persistent) {
    stats_.live_numel += u.info.numel;
    stats_.peak_live_numel = std::max(stats_.peak_live_numel, stats_.live_numel);
  } else {
    stats_.persistent_numel += u.info.numel;
  }
  stats_.all_gathers++;
  stats_.gathered_elements += P;
  stats_.gather_order.push_back(u.info.id);
  if (prefetch) {
    stats_.prefetches++;
    u.prefetched_unused = true;
    ahead_numel_ += u.info.numel;
  }
  const void* in = master_is_param(u) ? static_cast<const void*>(u.master) : u.compute_slice.data();
  if (swapped_slice != nullptr) in = swapped_slice;
  void* out = u.full.data();
  const char* source = from_secondary ? ", hpZ secondary partition" : layout_.hierarchical ? ", hierarchical" : "";
  const std::string over = from_secondary         ? groups_.hpz.label
                           : layout_.hierarchical ? groups_.shard_inter_node.label + ", then " +
                                                        groups_.shard_intra_node.label
                                                  : groups_.shard.label;
  const int pieces = from_secondary ? layout_.hpz_size : partition_size();
  const bool quantized = gathers_quantized(u) && pieces > 1;
  std::string what = log::concat("all_gather of unit '", u.info.name, "' (", P, " elements, ", dtype_name(ct),
                                 quantized ? " as int8" : "", source, prefetch ? ", prefetch" : "", ") over ", over);
  int rank = rank_;
  // qwZ (non-persistent units, as DeepSpeed's coordinator fetches them): every rank's piece travels as an int8
  // message of `words` fp32 words (docs/quantization.md). This rank's piece is quantized into `send`, the
  // collectives below move messages instead of elements into `recv`, and `recv` is dequantized into `full` in
  // rank order; the hpZ secondary chunk is then copied from the dequantized weights. The scratch (messages, and
  // MiCS's hierarchical inter-node stage) is allocated on the compute stream before the gather stream is ordered
  // after it.
  const QuantFormat fmt{8, config_.zero3.qwz_block_size};
  const int64_t piece = from_secondary ? P / layout_.hpz_size : S;  // elements per rank
  const int64_t words = quantized ? quant_message_bytes(piece, fmt) / 4 : piece;
  const DType wire = quantized ? DType::f32 : ct;
  const size_t ws = dtype_size(wire);
  const int nodes = layout_.hierarchical ? static_cast<int>(groups_.shard_inter_node.ranks.size()) : 0;
  const int64_t message_words = quantized ? words * (1 + pieces) : 0;
  if (quantized || layout_.hierarchical) {
    u.gather_scratch =
        DeviceBuffer(device_, counters_, MemoryCategory::buffers,
                     static_cast<size_t>(gather_scratch_bytes(piece, pieces, nodes, quantized, fmt,
                                                              static_cast<int64_t>(es))));
  }
  Stream s = nullptr;
  DeviceEvent* gathered = nullptr;
  CommQueue* queue = queue_.get();
  if (gather_stream_) {
    // The gather stream starts after the compute stream's work so far: the optimizer's writes of the input
    // slice, and the last use of the memory `full` recycles.
    if (!u.gather_ready) {
      u.gather_ready = device_.make_event();
      u.gathered = device_.make_event();
    }
    s = gather_stream_->get();
    u.gather_ready->record(compute_);
    u.gather_ready->wait_on(s);
    gathered = u.gathered.get();
    if (slices_on_host_ && !from_secondary) {
      // Parameter offload: the slice comes up into the rank's own place in `full`; the all-gather runs in place.
      void* own = element_ptr(out, ct, static_cast<int64_t>(layout_.shard_rank(rank_)) * S);
      const void* host = swapped_slice != nullptr ? swapped_slice : u.host_slice.data();
      device_.copy(own, host, static_cast<size_t>(S) * es, s);
      if (!u.slice_read) u.slice_read = device_.make_event();
      u.slice_read->record(s);
      in = own;
    }
  }

  const void* piece_in = from_secondary ? u.secondary.data() : in;
  const void* send = piece_in;
  void* recv = out;
  void* staged = nullptr;  // MiCS's hierarchical gather: the inter-node stage's pieces
  if (quantized || layout_.hierarchical) {
    if (quantized) {
      send = u.gather_scratch.data();
      recv = element_ptr(u.gather_scratch.data(), wire, words);
    }
    staged = element_ptr(u.gather_scratch.data(), wire, message_words);
  }

  // The collectives, in order, and their traffic.
  struct Part {
    Communicator* comm;
    void* out;
    const void* in;
    int64_t count;
  };
  std::vector<Part> parts;
  auto add = [&](const ProcessGroup& g, void* o, const void* i, int64_t count) {
    parts.push_back({g.comm.get(), o, i, count});
    count_collective(stats_.gather_traffic, g.link, CollectiveKind::all_gather, count, static_cast<int64_t>(ws));
  };
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  } fill;
  if (from_secondary) {
    add(groups_.hpz, recv, send, words);
  } else if (layout_.hierarchical) {
    // Between the nodes: the pieces of the shard group's ranks with this local rank (shard ranks i, L+i, 2L+i, ...);
    // then node chunk j of the result gathers, within each node, piece j*L+i from local rank i.
    const int per_node = layout_.nodes.ranks_per_node;
    add(groups_.shard_inter_node, staged, send, words);
    for (int j = 0; j < nodes; ++j) {
      add(groups_.shard_intra_node, element_ptr(recv, wire, static_cast<int64_t>(j) * per_node * words),
          element_ptr(staged, wire, j * words), words);
    }
  } else {
    add(groups_.shard, recv, send, words);
    if (u.secondary.allocated()) {
      // hpZ: keep this rank's chunk of the secondary partition for the gathers until the next optimizer step.
      const int64_t chunk = P / layout_.hpz_size;
      fill = {u.secondary.data(), element_ptr(out, ct, (rank_ % layout_.hpz_size) * chunk),
              static_cast<size_t>(chunk) * es};
      u.secondary_valid = true;
    }
  }
  struct Quantized {
    bool on = false;
    QuantFormat fmt;
    void* send = nullptr;
    const void* src = nullptr;
    const void* recv = nullptr;
    int64_t piece = 0;
    int pieces = 0;
  } q;
  if (quantized) q = {true, fmt, const_cast<void*>(send), piece_in, recv, piece, pieces};
  Device* device = &device_;
  u.gather_ticket =
      queue_->submit(what, [parts = std::move(parts), fill, q, device, ct, wire, out, what, rank, s, gathered, queue] {
        try {
          if (q.on) kernels_of(*device).quantize(q.send, q.src, ct, q.piece, 1, q.fmt, s);
          for (const Part& p : parts) {
            WorkPtr work = p.comm->all_gather_into(p.out, p.in, static_cast<size_t>(p.count), wire, s);
            if (s == nullptr) {
              work->wait();
            } else {
              queue->track(log::concat(what, " on rank ", rank), std::move(work));
            }
          }
          if (q.on) kernels_of(*device).dequantize(out, ct, q.recv, q.piece, q.pieces, q.fmt, s);
          if (fill.bytes > 0) device->copy(fill.dst, fill.src, fill.bytes, s);
          if (s != nullptr) gathered->record(s);
        } catch (const CommError&) {
          rethrow_comm_error(log::concat(what, " on rank ", rank, " failed: "));
        }
      });
  u.gather = GatherState::in_flight;
}

void EngineImpl::wait_gather(UnitState& u) {
  if (u.gather != GatherState::in_flight) return;
  double before = queue_->blocked_seconds();
  queue_->wait(u.gather_ticket);
  stats_.gather_wait_seconds += queue_->blocked_seconds() - before;
  u.gather_ticket = nullptr;
  // cuda: the compute stream (not the host) waits for the gather to land.
  if (u.gathered) u.gathered->wait_on(compute_);
  u.gather = GatherState::gathered;
  u.gather_scratch.reset();  // freed after the compute stream, which now waits for the gather
  if (slice_swapped(u)) {
    if (slices_on_host_) {
      u.host_slice.reset_after(*gather_stream_);  // once its copy up has run: the host does not wait
    } else if (param_reads_->claimed(static_cast<size_t>(u.info.id.index))) {
      param_reads_->release(static_cast<size_t>(u.info.id.index));
    }
  }
}

void EngineImpl::release_gather(UnitState& u) {
  if (u.gather == GatherState::released) return;
  if (u.gather == GatherState::in_flight) wait_gather(u);
  gathered_bytes_ -= static_cast<int64_t>(u.full.bytes());
  u.full.reset();
  if (u.info.persistent) {
    stats_.persistent_numel -= u.info.numel;
  } else {
    stats_.live_numel -= u.info.numel;
  }
  if (u.prefetched_unused) ahead_numel_ -= u.info.numel;
  u.prefetched_unused = false;
  u.kept = false;
  u.gather = GatherState::released;
  stats_.releases++;
}

void EngineImpl::make_room_for(UnitState& u) {
  // A unit being entered is always gathered; to respect stage3_max_live_parameters, units kept only for
  // reuse go first, the one used last first.
  const int64_t cap = schedule_policy_.max_live_numel;
  while (stats_.live_numel + u.info.numel > cap) {
    UnitState* victim = nullptr;
    int64_t victim_next = 0;
    for (UnitState& o : units_) {
      if (!o.kept || o.open_scopes > 0) continue;
      int64_t next = schedule_->next_use(o.info.id);
      int64_t rank = next < 0 ? INT64_MAX : next;
      if (!victim || rank > victim_next) {
        victim = &o;
        victim_next = rank;
      }
    }
    if (!victim) return;
    release_gather(*victim);
    stats_.evictions++;
  }
}

void EngineImpl::prefetch_after_entry() {
  auto plan = schedule_->plan_prefetch(ahead_numel_, stats_.live_numel, [this](UnitId id) {
    return units_[static_cast<size_t>(id.index)].gather == GatherState::released;
  });
  for (UnitId id : plan) issue_gather(units_[static_cast<size_t>(id.index)], true);
}

void EngineImpl::guard_calls(bool checking) {
  if (guard_ != nullptr) guard_->set_checking(checking);
}

void EngineImpl::end_micro_step_schedule(bool keep_first) {
  bool changed = schedule_->finish_micro_step();
  if (changed && micro_steps_ > 0) {
    log::debug("engine: the order of units changed in micro-step ", micro_steps_, "; following the new order");
  }
  if (!policy_.shard_params) return;
  // The first units of the order just finished (it is the trace now): a unit kept from its last use stays only
  // when it is among them, so what stays is what the boundary prefetch would have gathered.
  std::vector<bool> first(units_.size(), false);
  if (keep_first) {
    for (UnitId id : schedule_->plan_start()) first[static_cast<size_t>(id.index)] = true;
  }
  int64_t kept_numel = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    if (u.info.persistent) continue;
    if (first[i] && u.kept) {
      u.kept = false;
      u.prefetched_unused = true;  // as if gathered ahead: the next micro-step's entry counts a hit
      kept_numel += u.info.numel;
      stats_.boundary_keeps++;
    } else {
      release_gather(u);
    }
  }
  ahead_numel_ = kept_numel;
}

bool EngineImpl::keep_for_next_micro_step(const UnitState& u) const {
  if (evaluating_ || (micro_steps_ + 1) % gas_ == 0) return false;  // the optimizer step comes first
  if (!schedule_->following() || schedule_->next_use(u.info.id) >= 0) return false;
  for (UnitId id : schedule_->plan_start()) {
    if (id == u.info.id) return true;
  }
  return false;
}

// Every rank issues the same gathers here: the trace is the order the ranks agreed on (or will compare at the
// boundary, as every prefetch of the window), and the guard compares them as it will the next micro-step's calls.
void EngineImpl::prefetch_next_micro_step() {
  if (!policy_.shard_params || evaluating_) return;
  guard_calls(checking_order());
  const int64_t before = stats_.prefetches;
  prefetch_after_entry();
  stats_.boundary_prefetches += stats_.prefetches - before;
}

// ---------------------------------------------------------------------------------------------------------
// Scopes

UnitScope EngineImpl::enter(UnitId unit, Phase phase) {
  check_usable();
  const char* what = phase == Phase::forward ? "forward_scope" : "backward_scope";
  require_materialized(what);
  UnitState& u = unit_state(unit, what);
  ZERO3_REQUIRE(!(evaluating_ && phase == Phase::backward), InvalidArgument, "Engine::backward_scope('", u.info.name,
                "'): the engine is evaluating (no gradients); end the EvalMode first");
  ScheduleEvent event{unit, phase};
  try {
    const int64_t code = event_code(unit, phase, false);
    guard_calls(checking_order());
    if (checking_order()) check_order(code, log::concat(what, "('", u.info.name, "')"));
    record_event(code);
    schedule_->record(event);
    if (policy_.shard_params) {
      if (u.prefetched_unused) {
        stats_.prefetch_hits++;
        u.prefetched_unused = false;
        ahead_numel_ -= u.info.numel;
      }
      u.kept = false;
      if (u.gather == GatherState::released) {
        make_room_for(u);
        issue_gather(u, false);
      }
      prefetch_after_entry();
      wait_gather(u);
    }
  } catch (...) {
    fail(std::current_exception());
  }
  void* grads = nullptr;
  if (phase == Phase::backward) {
    DeviceBuffer buf(device_, counters_, MemoryCategory::grads, u.info.padded_numel * dtype_size(acc_dtype_));
    device_.fill_zero(buf.data(), buf.bytes(), compute_);
    grads = buf.data();
    open_grads_.emplace(grads, std::move(buf));
  }
  u.open_scopes++;
  open_scopes_++;
  if (phase == Phase::backward) window_backward_ = true;
  if (policy_.shard_params) prefetch_param_reads();  // with the scope open: it knows whether u is read again
  return UnitScope(this, unit, phase, grads);
}

void EngineImpl::exit(UnitScope& scope) {
  UnitState& u = units_[static_cast<size_t>(scope.unit().index)];
  record_event(event_code(scope.unit(), scope.phase(), true));
  void* grads = scope.grads_;
  scope.impl_ = nullptr;
  scope.grads_ = nullptr;
  u.open_scopes--;
  open_scopes_--;
  DeviceBuffer buf;
  if (grads) {
    auto it = open_grads_.find(grads);
    buf = std::move(it->second);
    open_grads_.erase(it);
  }
  if (fatal_error_) return;  // the engine is failed: release memory only
  try {
    if (grads) {
      if (policy_.shard_grads) {
        reducer_->add_scatter(u.info.name, grads, u.info.slice_numel, u.grad_acc.data());
      } else {
        kernels_of(device_).scale_add(u.grad_acc.data(), acc_dtype_, grads, acc_dtype_, 1.0f, u.info.numel, compute_);
      }
    }
    if (policy_.shard_params && u.open_scopes == 0 && !u.info.persistent) {
      if (schedule_->keep_for_reuse(u.info.id) && stats_.live_numel <= schedule_policy_.max_live_numel) {
        u.kept = true;
        stats_.reuse_keeps++;
      } else if (keep_for_next_micro_step(u)) {
        u.kept = true;  // counted as a boundary keep if it stays past the micro-step's end
      } else {
        release_gather(u);
        prefetch_param_reads();  // its next use may be among the next units to read
      }
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void EngineImpl::exit_noexcept(UnitScope& scope) noexcept {
  try {
    exit(scope);
  } catch (const std::exception& e) {
    if (!deferred_error_) deferred_error_ = std::current_exception();
    log::error("closing the scope of unit '", units_[static_cast<size_t>(scope.unit().index)].info.name,
               "' failed (the next engine call rethrows it): ", e.what());
  } catch (...) {
    if (!deferred_error_) deferred_error_ = std::current_exception();
  }
}

TensorView EngineImpl::param_view(UnitId unit, ParamId param) const {
  const UnitState& u = units_[static_cast<size_t>(unit.index)];
  const ParamState& p = param_state(param, "UnitScope::param");
  ZERO3_REQUIRE(p.info.unit == unit, InvalidArgument, "UnitScope::param: parameter '", p.info.name,
                "' belongs to another unit than '", u.info.name, "'");
  TensorView v;
  v.data = element_ptr(u.full.data(), u.info.dtype, p.info.offset);
  v.dtype = u.info.dtype;
  v.shape = p.info.shape;
  v.numel = p.info.numel;
  return v;
}

TensorView EngineImpl::grad_view(UnitId unit, ParamId param, void* grads) const {
  const UnitState& u = units_[static_cast<size_t>(unit.index)];
  const ParamState& p = param_state(param, "UnitScope::grad");
  ZERO3_REQUIRE(grads != nullptr, InvalidArgument, "UnitScope::grad: the scope of unit '", u.info.name,
                "' is a forward scope; gradients exist in backward scopes only");
  ZERO3_REQUIRE(p.info.unit == unit, InvalidArgument, "UnitScope::grad: parameter '", p.info.name,
                "' belongs to another unit than '", u.info.name, "'");
  TensorView v;
  v.data = element_ptr(grads, acc_dtype_, p.info.offset);
  v.dtype = acc_dtype_;
  v.shape = p.info.shape;
  v.numel = p.info.numel;
  return v;
}

TensorView EngineImpl::flat_param_view(UnitId unit) const {
  const UnitState& u = units_[static_cast<size_t>(unit.index)];
  return TensorView{u.full.data(), u.info.dtype, u.flat_shape, u.info.numel};
}

TensorView EngineImpl::flat_grad_view(UnitId unit, void* grads) const {
  const UnitState& u = units_[static_cast<size_t>(unit.index)];
  ZERO3_REQUIRE(grads != nullptr, InvalidArgument, "UnitScope::flat_grads: the scope of unit '", u.info.name,
                "' is a forward scope; gradients exist in backward scopes only");
  return TensorView{grads, acc_dtype_, u.flat_shape, u.info.numel};
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

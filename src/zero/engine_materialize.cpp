// Declaration and materialization: units and parameters declared (nothing allocated), the ranks' agreement on
// the model, then each rank's state allocated and its slice filled (Philox or the caller's reader), with the
// compute copies built from the master.
#include <algorithm>
#include <map>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "kernels/philox_init.hpp"
#include "zero/engine_impl.hpp"
#include "zero/param_fill.hpp"
#include "zero/partition.hpp"
#include "zero/persistence_log.hpp"
#include "zero/rank_agreement.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

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
  int64_t total_numel = 0;
  // Slices of the partition: over every rank, or under MiCS over the shard group (replicated across the groups).
  const int partition = partition_size();
  for (UnitState& u : units_) {
    u.info.slice_numel = slice_numel(u.info.numel, partition);
    u.info.padded_numel = u.info.slice_numel * partition;
    u.flat_shape = {u.info.numel};
    bool keep = policy_.shard_params && u.info.numel <= persistence_threshold_ &&
                persistent_total + u.info.numel <= config_.zero.model_persistence_threshold;
    if (keep) persistent_total += u.info.numel;
    u.info.persistent = keep;
    numels.push_back(u.info.numel);
    persistent.push_back(keep);
    total_numel += u.info.numel;
  }
  if (policy_.shard_params) {
    log_persistence(units_, persistence_threshold_, config_.zero.model_persistence_threshold, world_);
  }
  schedule_ = std::make_unique<Schedule>(schedule_policy_, numels, persistent);
  eval_schedule_ = std::make_unique<Schedule>(schedule_policy_, numels, persistent);

  make_reducers();

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
    const size_t bytes = static_cast<size_t>(P / layout_.hpz_size) * dtype_size(ct);
    if (secondary_on_host_) {
      u.host_secondary = HostBuffer(device_, HostMemory::pinned, host_counters_, MemoryCategory::params, bytes);
    } else {
      u.secondary = DeviceBuffer(device_, counters_, MemoryCategory::params, bytes);
    }
  }
  int64_t acc_numel = policy_.shard_grads ? S : P;
  u.grad_acc = DeviceBuffer(device_, counters_, MemoryCategory::grads, acc_numel * dtype_size(acc_dtype_));
  device_.fill_zero(u.grad_acc.data(), u.grad_acc.bytes());
  if (reduce_once_per_step_) {
    u.step_grads = DeviceBuffer(device_, counters_, MemoryCategory::grads, P * dtype_size(acc_dtype_));
    device_.fill_zero(u.step_grads.data(), u.step_grads.bytes());
  }
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

}  // namespace zero3::detail

// step(): the end of a micro-step and, at accumulation boundaries, the optimizer step.
//
//   flush the reducer ─► (stage 0-1: all-reduce the accumulators) ─► Inf/NaN count + sum of squares,
//   all-reduced ─► loss scaler decides: skip, or ─► clip coefficient ─► Adam on each owned range in
//   sub_group_size tiles, writing the compute copy in the same pass ─► all-gather the parameters
//   (stage 1-2) or the persistent units (stage 3) ─► zero the accumulators.
// With optimizer offload on a GPU the Adam tiles run on the host: each tile's gradients come down and its
// compute copy goes back up while the host steps the neighbouring tile (run_host_optimizer, tile_transfer.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "offload/cpu_adam.hpp"
#include "optim/grad_norm.hpp"
#include "zero/engine_impl.hpp"
#include "zero/rank_agreement.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

void EngineImpl::run_collective(const std::string& what, const std::function<void()>& fn) {
  auto ticket = queue_->submit(what, [&] {
    try {
      fn();
    } catch (const CommError&) {
      rethrow_comm_error(log::concat(what, " on rank ", rank_, " failed: "));
    }
  });
  queue_->wait(ticket);
}

void EngineImpl::publish_params(UnitState& u) {
  // Stage 1-2: each rank updated its slice of `full`; the all-gather runs in place.
  const DType ct = u.info.dtype;
  const int64_t S = u.info.slice_numel;
  void* out = u.full.data();
  const void* in = element_ptr(u.full.data(), ct, u.owned_begin);
  Communicator* comm = groups_.shard.comm.get();
  count_collective(stats_.gather_traffic, groups_.shard.link, CollectiveKind::all_gather, S,
                   static_cast<int64_t>(dtype_size(ct)));
  run_collective(log::concat("all_gather of the parameters of unit '", u.info.name, "' (", u.info.padded_numel,
                             " elements, ", dtype_name(ct), ") over ", groups_.shard.label),
                 [=, s = compute_] { comm->all_gather_into(out, in, static_cast<size_t>(S), ct, s)->wait(); });
  stats_.gathered_elements += u.info.padded_numel;
}

void EngineImpl::issue_collective(const std::string& what, const std::function<WorkPtr()>& fn) {
  const bool streams = gather_stream_ != nullptr;
  queue_->wait(queue_->submit(what, [&] {
    WorkPtr work;
    try {
      work = fn();
      if (!streams) work->wait();
    } catch (const CommError&) {
      rethrow_comm_error(log::concat(what, " on rank ", rank_, " failed: "));
    }
    if (streams) queue_->track(log::concat(what, " on rank ", rank_), std::move(work));
  }));
}

// One host wait for everything the boundary needs from the other ranks. Device memory (transient, from the pool):
// the statistics' double accumulator, then the values the ranks reduce: the window's agreement (max of v and -v,
// as ranks_agree) and the two statistics floats; pinned host memory receives the values in one copy.
EngineImpl::BoundaryValues EngineImpl::read_boundary(bool stats) {
  BoundaryValues out;
  const bool agree = !window_events_.empty();
  if (!agree && !stats) return out;
  constexpr size_t kAgree = 8, kValues = kAgree + 2;
  const size_t acc_bytes = 2 * sizeof(double), value_bytes = kValues * sizeof(float);
  auto* host = static_cast<float*>(device_.allocate_host(value_bytes));
  void* dev = nullptr;
  try {
    dev = device_.allocate(acc_bytes + value_bytes);
  } catch (...) {
    device_.deallocate_host(host, value_bytes);
    throw;
  }
  auto* acc = static_cast<double*>(dev);
  auto* values = reinterpret_cast<float*>(static_cast<char*>(dev) + acc_bytes);
  bool agreed = true;
  try {
    if (agree) {
      std::vector<float> mine = hash_to_floats(window_hash_);
      mine.push_back(static_cast<float>(window_event_count_ % (kMaxExactFloatInt / 2)));
      for (size_t i = 0; i < 4; ++i) {
        host[i] = mine[i];
        host[4 + i] = -mine[i];
      }
      device_.copy(values, host, kAgree * sizeof(float), compute_);
      Communicator* comm = comm_.get();
      issue_collective(log::concat("schedule agreement at the boundary of micro-steps ", window_positions_.front(),
                                   " to ", window_positions_.back()),
                       [&] { return comm->all_reduce(values, kAgree, DType::f32, ReduceOp::max, compute_); });
    }
    if (stats) {
      // Inf/NaN and the squared norm over this rank's owned ranges, accumulated on the device. At stage 0 every
      // rank holds the same full gradients, so max over ranks (of equal values) keeps them exact; sharded ranges
      // are summed. Over the partition's group: under MiCS every shard group holds the same (all-reduced) gradients.
      auto& k = kernels_of(device_);
      device_.fill_zero(acc, acc_bytes, compute_);
      for (const UnitState& u : units_)
        k.accumulate_grad_stats(owned_grads(u), acc_dtype_, u.owned_valid, acc, compute_);
      k.grad_stats_to_f32(acc, values + kAgree, compute_);
      const ReduceOp op = policy_.shard_optimizer ? ReduceOp::sum : ReduceOp::max;
      Communicator* comm = groups_.shard.comm.get();
      issue_collective("all_reduce of the gradient statistics (Inf/NaN count, squared norm) over " + groups_.shard.label,
                       [&] { return comm->all_reduce(values + kAgree, 2, DType::f32, op, compute_); });
      if (pipeline_group_ && pipeline_group_->size() > 1) {
        // A pipeline stage: the other stages' counts and squared norms, so that every stage takes the same step.
        Communicator* stages = pipeline_group_.get();
        issue_collective(log::concat("all_reduce of the gradient statistics over the ", stages->size(),
                                     " pipeline stages"),
                         [&] { return stages->all_reduce(values + kAgree, 2, DType::f32, ReduceOp::sum, compute_); });
      }
    }
    device_.copy(host, values, value_bytes, compute_);
    wait_for_device_writes();  // the boundary's one host wait
    queue_->drain();           // every Work of the window is complete by now: checked without waiting
    for (size_t i = 0; agree && i < 4; ++i) agreed = agreed && host[i] == -host[4 + i];
    out.stats[0] = host[kAgree];
    out.stats[1] = host[kAgree + 1];
  } catch (...) {
    device_.deallocate_after(dev, acc_bytes + value_bytes, compute_);
    device_.deallocate_host_after(host, value_bytes, compute_);
    throw;
  }
  device_.deallocate_after(dev, acc_bytes + value_bytes, compute_);
  device_.deallocate_host(host, value_bytes);
  if (agree && !agreed) {
    // Which micro-step differs: every rank's events of the window, compared micro-step by micro-step.
    std::vector<int64_t> flat;
    for (const auto& e : window_events_) {
      flat.push_back(static_cast<int64_t>(e.size()));
      flat.insert(flat.end(), e.begin(), e.end());
    }
    auto all = gather_from_ranks(*queue_, *comm_, flat,
                                 "schedule agreement: exchanging the events of micro-steps " +
                                     window_positions_.front() + " to " + window_positions_.back(),
                                 &device_);
    std::vector<size_t> at(all.size(), 0);
    for (size_t m = 0; m < window_events_.size(); ++m) {
      std::vector<std::vector<int64_t>> step_events(all.size());
      for (size_t r = 0; r < all.size(); ++r) {
        const auto& v = all[r];
        if (at[r] >= v.size()) continue;
        const auto n = static_cast<size_t>(v[at[r]]);
        const size_t end = std::min(v.size(), at[r] + 1 + n);
        step_events[r].assign(v.begin() + static_cast<std::ptrdiff_t>(at[r] + 1),
                              v.begin() + static_cast<std::ptrdiff_t>(end));
        at[r] = end;
      }
      std::string message = divergence_message(step_events, window_positions_[m]);
      if (!message.empty()) throw CommError(message);
    }
    throw CommError(log::concat("the ranks' scope events of micro-steps ", window_positions_.front(), " to ",
                                window_positions_.back(), " hash differently (rank ", rank_, ")"));
  }
  window_events_.clear();
  window_positions_.clear();
  window_hash_ = 0;
  window_event_count_ = 0;
  return out;
}

void EngineImpl::run_optimizer(const AdamStepConsts& consts, float grad_factor) {
  if (optimizer_on_host_) {
    run_host_optimizer(consts, grad_factor);
    return;
  }
  auto& k = kernels_of(device_);
  const int64_t tile = config_.zero.sub_group_size;
  DeviceBuffer f32_tile;  // gradients converted to fp32 when they accumulate in 16 bits
  // The fp32 gradients of [a, a + n) of u's owned range, unscaled and clipped.
  auto tile_grads = [&](UnitState& u, int64_t a, int64_t n) -> float* {
    void* g_all = owned_grads(u);
    if (acc_dtype_ == DType::f32) {
      float* g = static_cast<float*>(g_all) + a;
      if (grad_factor != 1.0f) k.scale_copy(g, DType::f32, g, DType::f32, grad_factor, n);
      return g;
    }
    if (f32_tile.bytes() < static_cast<size_t>(n) * sizeof(float)) {
      f32_tile = DeviceBuffer(device_, counters_, MemoryCategory::buffers, static_cast<size_t>(n) * sizeof(float));
    }
    float* g = f32_tile.as<float>();
    k.scale_copy(g, DType::f32, element_ptr(g_all, acc_dtype_, a), acc_dtype_, grad_factor, n);
    return g;
  };
  // Where the updated compute-dtype parameters of [a, a + n) go (null: the master is the parameter).
  auto compute_copy = [&](UnitState& u, int64_t a) -> void* {
    const DType ct = u.info.dtype;
    if (master_is_param(u)) return nullptr;
    return policy_.shard_params ? element_ptr(u.compute_slice.data(), ct, a)
                                : element_ptr(u.full.data(), ct, u.owned_begin + a);
  };

  if (opt_swap_) {
    // NVMe (cpu device): stream every tile (master, exp_avg, exp_avg_sq back to back) through the swapper's
    // buffers, with reads ahead and writes behind per pipeline_read/pipeline_write; gradients stay in host
    // memory. The compute copy is written in the same pass: the 16-bit parameters, or with fp32 compute the
    // resident parameter array (u.master), which receives an exact copy of the updated master.
    staging_.clear();  // local_shard() copies are stale after this step
    opt_swap_->swapper().run(offload::SwapPass::read_write, [&](size_t t, std::span<std::byte> data) {
      const OptimizerSwapTile& st = opt_swap_->tiles()[t];
      UnitState& u = units_[st.unit];
      const int64_t a = st.begin;
      const int64_t n = std::clamp<int64_t>(u.owned_valid - a, 0, st.length);
      if (n == 0) return;  // padding only
      step_slice_for(&u);
      auto* p = reinterpret_cast<float*>(data.data());
      float* m = p + st.length;
      float* v = p + 2 * st.length;
      void* copy = compute_copy(u, a);
      DType copy_dtype = u.info.dtype;
      if (copy == nullptr) {
        copy = u.master + a;
        copy_dtype = DType::f32;
      }
      cpu_adam_step(p, tile_grads(u, a, n), m, v, static_cast<size_t>(n), consts, copy, copy_dtype);
    });
    return;
  }

  // Parameter offload on a GPU with the optimizer on the device: each tile's compute copy is written to a
  // device tile and copied down into the host slice on the compute stream.
  DeviceBuffer copy_tile;
  for (UnitState& u : units_) {
    const size_t es = dtype_size(u.info.dtype);
    if (u.owned_valid > 0) step_slice_for(&u);
    for (int64_t a = 0; a < u.owned_valid; a += tile) {
      int64_t n = std::min(tile, u.owned_valid - a);
      float* g = tile_grads(u, a, n);
      float* m = u.exp_avg + a;
      float* v = u.exp_avg_sq + a;
      if (offload_optimizer_) {
        // CPU offload (only on the cpu device, where the state is already in host memory): the SIMD CPU Adam
        // over the tile, writing the 16-bit copy in the same pass.
        cpu_adam_step(u.master + a, g, m, v, static_cast<size_t>(n), consts, compute_copy(u, a), u.info.dtype);
      } else if (slices_on_host_) {
        if (copy_tile.bytes() < static_cast<size_t>(n) * es) {
          copy_tile = DeviceBuffer(device_, counters_, MemoryCategory::buffers, static_cast<size_t>(n) * es);
        }
        k.adam(u.master + a, g, m, v, n, consts, copy_tile.data(), u.info.dtype);
        device_.copy(element_ptr(u.host_slice.data(), u.info.dtype, a), copy_tile.data(), static_cast<size_t>(n) * es,
                     compute_);
      } else {
        k.adam(u.master + a, g, m, v, n, consts, compute_copy(u, a), u.info.dtype);
      }
    }
  }
}

void EngineImpl::run_host_optimizer(const AdamStepConsts& consts, float grad_factor) {
  // Optimizer offload on a GPU: the tiles of every unit's owned range in order (with NVMe, the swap file's
  // tiles), each: gradients down, CPU Adam on the host state, compute copy up (or straight into the host
  // slice with parameter offload). TileTransfer overlaps the copies with Adam.
  struct StepTile {
    UnitState* u;
    int64_t begin;
    int64_t n;
  };
  std::vector<StepTile> tiles;
  std::vector<size_t> position;  // NVMe: swap tile index -> index in `tiles` (SIZE_MAX: padding only)
  if (opt_swap_) {
    for (const OptimizerSwapTile& st : opt_swap_->tiles()) {
      UnitState& u = units_[st.unit];
      const int64_t n = std::clamp<int64_t>(u.owned_valid - st.begin, 0, st.length);
      position.push_back(n > 0 ? tiles.size() : SIZE_MAX);
      if (n > 0) tiles.push_back({&u, st.begin, n});
    }
  } else {
    const int64_t tile = transfer_->tile_numel();
    for (UnitState& u : units_) {
      for (int64_t a = 0; a < u.owned_valid; a += tile) tiles.push_back({&u, a, std::min(tile, u.owned_valid - a)});
    }
  }
  auto fetch = [&](size_t i) {
    const StepTile& t = tiles[i];
    transfer_->fetch(element_ptr(owned_grads(*t.u), acc_dtype_, t.begin), t.n);
  };
  size_t next = 0;
  const UnitState* slice_checked = nullptr;
  auto step_tile = [&](size_t i, float* p, float* m, float* v) {
    if (next < tiles.size()) fetch(next++);  // comes down while this tile is stepped
    const StepTile& t = tiles[i];
    UnitState& u = *t.u;
    const DType ct = u.info.dtype;
    step_slice_for(&u);
    float* g = transfer_->take(grad_factor);
    if (slices_on_host_) {
      if (slice_checked != &u) before_host_slice_write(u);
      slice_checked = &u;
      cpu_adam_step(p, g, m, v, static_cast<size_t>(t.n), consts, element_ptr(u.host_slice.data(), ct, t.begin), ct);
      return;
    }
    cpu_adam_step(p, g, m, v, static_cast<size_t>(t.n), consts, transfer_->copy_staging(), ct);
    void* dst = policy_.shard_params ? element_ptr(u.compute_slice.data(), ct, t.begin)
                                     : element_ptr(u.full.data(), ct, u.owned_begin + t.begin);
    transfer_->send(dst, static_cast<size_t>(t.n) * dtype_size(ct));
  };

  transfer_->begin();
  try {
    if (!tiles.empty()) fetch(next++);
    if (opt_swap_) {
      staging_.clear();  // local_shard() copies are stale after this step
      opt_swap_->swapper().run(offload::SwapPass::read_write, [&](size_t t, std::span<std::byte> data) {
        if (position[t] == SIZE_MAX) return;  // padding only
        const int64_t len = opt_swap_->tiles()[t].length;
        auto* p = reinterpret_cast<float*>(data.data());
        step_tile(position[t], p, p + len, p + 2 * len);
      });
    } else {
      for (size_t i = 0; i < tiles.size(); ++i) {
        const StepTile& t = tiles[i];
        step_tile(i, t.u->master + t.begin, t.u->exp_avg + t.begin, t.u->exp_avg_sq + t.begin);
      }
    }
  } catch (...) {
    transfer_->end();
    throw;
  }
  transfer_->end();
}

void EngineImpl::wait_for_device_writes() {
  // The host is about to read host memory that work on the compute stream writes.
  if (!host_ready_) host_ready_ = device_.make_event();
  host_ready_->record(compute_);
  host_ready_->synchronize();
}

StepResult EngineImpl::step() {
  check_usable();
  require_materialized("step");
  ZERO3_REQUIRE(!evaluating_, InvalidArgument, "Engine::step: the engine is evaluating; end the EvalMode first");
  if (open_scopes_ > 0) {
    std::string names;
    for (const UnitState& u : units_) {
      if (u.open_scopes > 0) names += (names.empty() ? "'" : ", '") + u.info.name + "'";
    }
    throw InvalidArgument("Engine::step: close every scope first; still open: " + names);
  }
  StepResult result;
  try {
    // Before anything of the step: the final bucket's size and the reduced sums depend on the order. Checked at
    // once in the first micro-step (and every one with check_schedule_every_step); otherwise the window's other
    // micro-steps together at the boundary, before the optimizer, in the all-reduce of the gradient statistics (a
    // comparison per micro-step would cross the nodes' links once more per micro-step; a collective of another
    // size is still caught before it moves data: by Gloo, or on nccl by the CollectiveGuard).
    const bool checking = checking_order();
    guard_calls(checking);
    if (checking) check_order(step_code(), "step()");
    if (defer_agreement_ && !checking) {
      defer_schedule_check();
    } else {
      verify_schedule("step()");
    }
    reset_events();
    end_micro_step_schedule(micro_steps_ % gas_ != gas_ - 1);  // within the window: keep the first units
    reducer_->flush();
    if (gather_stream_ == nullptr) queue_->drain();  // cuda: the Works are checked at the boundary
    ++micro_steps_;
    ++local_micro_steps_;
    result.micro_step = micro_steps_;
    if (micro_steps_ % gas_ != 0) {
      result.loss_scale = loss_scaler_.scale();
      result.global_step = global_steps_;
      // The parameters do not change: the next micro-step's first units are gathered now (or kept).
      prefetch_next_micro_step();
      prefetch_param_reads();  // the slices of the units after them
      return result;
    }
    result.boundary = true;
    // A pipeline stage always steps: the other stages' statistics wait for its own (a stage without backward scopes
    // adds zeros, and its units are stepped with zero gradients, as below for a unit without a backward scope).
    if (!window_backward_ && !pipeline_group_) {
      read_boundary(false);  // the window's deferred agreement
      // No backward scope since the last boundary, on any rank (the ranks' scopes were just compared): nothing
      // to apply. Like PyTorch's optimizers with no gradients: no update, no weight decay, no Adam step, and the
      // lr schedule does not move. Counted as a skipped step.
      ++global_steps_;
      ++skipped_steps_;
      result.global_step = global_steps_;
      result.lr = adam_hyper_at(adam_, *lr_scheduler_, applied_steps_ - 1).lr;
      result.loss_scale = loss_scaler_.scale();
      log::info_rank0("step ", global_steps_, ": no backward_scope since the last optimizer step; nothing applied");
      prefetch_next_micro_step();
      prefetch_param_reads();
      return result;
    }
    window_backward_ = false;
    reduce_at_boundary();

    // The Inf/NaN count and the squared norm, agreed by every rank (the optimizer step needs them on the host).
    const BoundaryValues boundary = read_boundary(true);
    const float* agreed = boundary.stats;
    const bool overflow = agreed[0] > 0.0f;
    const double scale = loss_scaler_.scale();
    const bool applied = loss_scaler_.update(overflow) && !overflow;
    ++global_steps_;
    result.global_step = global_steps_;
    result.overflow = overflow;
    result.grad_norm =
        overflow ? std::numeric_limits<double>::infinity() : std::sqrt(static_cast<double>(agreed[1])) / scale;
    AdamHyper hyper = adam_hyper_at(adam_, *lr_scheduler_, applied_steps_ - 1);
    result.lr = hyper.lr;
    if (!applied) {
      ++skipped_steps_;
      zero_grads();
      result.loss_scale = loss_scaler_.scale();
      log::info_rank0("step ", global_steps_, ": Inf/NaN in the gradients, step skipped (loss scale now ",
                      loss_scaler_.scale(), ")");
      prefetch_next_micro_step();
      prefetch_param_reads();
      return result;
    }
    double coef = clip_coefficient(result.grad_norm, *config_.gradient_clipping);
    result.clip_coef = coef;
    ++applied_steps_;
    AdamStepConsts consts = adam_step_consts(hyper, applied_steps_);
    run_optimizer(consts, static_cast<float>(coef / scale));
    for (UnitState& u : units_) u.secondary_valid = false;  // hpZ: the next gathers read the new primary slices
    if (param_swap_) {
      // Units of which this rank owns only padding had no tile: their (zero) slices are rewritten too.
      for (UnitState& u : units_) {
        if (u.owned_valid == 0) step_slice_for(&u);
      }
      step_slice_for(nullptr);
    }
    for (UnitState& u : units_) {
      if (policy_.shard_optimizer && !policy_.shard_params) publish_params(u);
      if (policy_.shard_params && u.info.persistent) {
        release_gather(u);
        issue_gather(u, false);
        wait_gather(u);
      }
    }
    // The next micro-step's first units from the updated slices: the gathers start after the optimizer's writes
    // (ordered after the compute stream's work so far; hpZ's secondary partition was invalidated above).
    prefetch_next_micro_step();
    prefetch_param_reads();  // the new slices of the units after them
    zero_grads();
    result.applied = true;
    result.loss_scale = loss_scaler_.scale();
    if (config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0) {
      log::info_rank0("step ", global_steps_, ": lr ", result.lr, ", grad norm ", result.grad_norm,
                      result.clip_coef < 1.0 ? " (clipped)" : "", ", loss scale ", result.loss_scale, ", skipped ",
                      skipped_steps_, ", peak ", counters_.peak_total() >> 20, " MiB");
    }
  } catch (...) {
    fail(std::current_exception());
  }
  return result;
}

void EngineImpl::all_reduce_host(float* values, size_t count, ReduceOp op) {
  check_usable();
  guard_calls(true);
  ZERO3_REQUIRE(values != nullptr || count == 0, InvalidArgument, "Engine::all_reduce_host: values is null for ", count,
                " value(s)");
  Communicator* comm = comm_.get();
  DeviceMirror buf(&device_, values, count);  // the communicator's memory: a device copy for nccl
  try {
    run_collective(
        log::concat("all_reduce_host of ", count, " value(s) (", reduce_op_name(op), ") over all ", world_, " ranks"),
        [&] { comm->all_reduce(buf.get(), count, DType::f32, op)->wait(); });
  } catch (...) {
    fail(std::current_exception());
  }
  buf.copy_back();
}

void EngineImpl::gather_master_params(UnitId unit, float* out) {
  check_usable();
  require_materialized("gather_master_params");
  UnitState& u = unit_state(unit, "gather_master_params");
  ZERO3_REQUIRE(out != nullptr, InvalidArgument, "Engine::gather_master_params: output is null for unit '", u.info.name,
                "'");
  guard_calls(true);
  const float* master = u.master;
  std::vector<float> swapped;  // NVMe with 16-bit compute: the master slice read from the swap file
  if (opt_swap_) {
    const size_t idx = static_cast<size_t>(&u - units_.data());
    if (auto it = staging_.find(idx); it != staging_.end()) {
      master = it->second.master.data();
    } else if (master == nullptr) {
      swapped.resize(static_cast<size_t>(u.owned_len));
      opt_swap_->read_unit(idx, swapped.data(), nullptr, nullptr);
      master = swapped.data();
    }
  }
  if (!policy_.shard_optimizer) {
    device_.copy(out, master, static_cast<size_t>(u.info.numel) * sizeof(float));
    return;
  }
  DeviceBuffer all(device_, counters_, MemoryCategory::buffers, u.info.padded_numel * sizeof(float));
  const float* in = master;
  int64_t S = u.info.slice_numel;
  if (optimizer_on_host_) {
    // The master is in host memory: it goes to the rank's place in `all`, and the all-gather runs in place.
    float* own = all.as<float>() + static_cast<int64_t>(layout_.shard_rank(rank_)) * S;
    device_.copy(own, master, static_cast<size_t>(S) * sizeof(float));
    in = own;
  }
  Communicator* comm = groups_.shard.comm.get();
  try {
    run_collective(
        log::concat("all_gather of the fp32 master parameters of unit '", u.info.name, "' over ", groups_.shard.label),
        [&] { comm->all_gather_into(all.data(), in, static_cast<size_t>(S), DType::f32, compute_)->wait(); });
  } catch (...) {
    fail(std::current_exception());
  }
  device_.copy(out, all.data(), static_cast<size_t>(u.info.numel) * sizeof(float));
}

void EngineImpl::refresh_params() {
  check_usable();
  require_materialized("refresh_params");
  ZERO3_REQUIRE(open_scopes_ == 0, InvalidArgument, "Engine::refresh_params: close every scope first");
  guard_calls(true);
  try {
    for (size_t i = 0; i < units_.size(); ++i) {
      UnitState& u = units_[i];
      if (policy_.shard_params) release_gather(u);
      u.secondary_valid = false;
      const float* master = nullptr;
      if (opt_swap_) {
        // NVMe: what local_shard() staged (and the caller may have changed) goes back to the swap file;
        // the compute copies are rebuilt from it.
        auto it = staging_.find(i);
        if (it == staging_.end()) {
          local_shard(u.info.id);
          it = staging_.find(i);
        }
        ShardStaging& st = it->second;
        opt_swap_->write_unit(i, st.master.data(), st.exp_avg.data(), st.exp_avg_sq.data());
        if (master_is_param(u)) {
          std::copy(st.master.begin(), st.master.end(), u.master);
        } else {
          master = st.master.data();
        }
      }
      build_compute_copies(u, master);
    }
    queue_->drain();
    staging_.clear();
    prefetch_next_micro_step();  // from the new values: every gathered copy was dropped above
  } catch (...) {
    fail(std::current_exception());
  }
}

}  // namespace zero3::detail

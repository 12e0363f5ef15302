// Offload state: the optimizer's state spilled to the NVMe swap, the compute-dtype slices rebuilt and written
// back when they live in the swap file, the reads of those slices ahead along the schedule that feed the unit's
// all-gather, and the host staging of a swapped unit's optimizer state for local_shard().
#include <algorithm>
#include <cstring>

#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

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
    if (o.secondary_valid) return false;  // hpZ: its gathers until the optimizer step read the secondary partition
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

ShardView EngineImpl::local_shard(UnitId unit) {
  require_materialized("local_shard");
  UnitState& u = unit_state(unit, "local_shard");
  if (!opt_swap_) {
    return ShardView{u.owned_begin, u.owned_len, u.master, u.exp_avg, u.exp_avg_sq};
  }
  // NVMe: the whole slice is read from the swap file into host staging (3 x owned_len floats; a read of the
  // slice's share of the file) and kept until the next step() or refresh_params().
  const size_t idx = static_cast<size_t>(&u - units_.data());
  auto it = staging_.find(idx);
  if (it == staging_.end()) {
    ShardStaging st;
    const auto len = static_cast<size_t>(u.owned_len);
    st.master.resize(len);
    st.exp_avg.resize(len);
    st.exp_avg_sq.resize(len);
    opt_swap_->read_unit(idx, st.master.data(), st.exp_avg.data(), st.exp_avg_sq.data());
    it = staging_.emplace(idx, std::move(st)).first;
  }
  return ShardView{u.owned_begin, u.owned_len, it->second.master.data(), it->second.exp_avg.data(),
                   it->second.exp_avg_sq.data()};
}

}  // namespace zero3::detail

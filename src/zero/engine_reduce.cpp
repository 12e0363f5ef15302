// The reduction path: the reducers materialize() sets up (the shard group's, and MiCS's across the replicas), a
// backward scope's gradients handed to them when it closes (in the window's last micro-step also to MiCS's
// all-reduce across the replicas), and the boundary's flush and, at stage 0-1, its all-reduce of the accumulators.
// The buckets themselves: reducer.hpp.
#include <algorithm>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"

namespace zero3::detail {

void EngineImpl::make_reducers() {
  int64_t total_slice = 0, total_numel = 0, largest_slice = 0, largest_numel = 0;
  for (const UnitState& u : units_) {
    largest_slice = std::max(largest_slice, u.info.slice_numel);
    largest_numel = std::max(largest_numel, u.info.numel);
    total_slice += u.info.slice_numel;
    total_numel += u.info.numel;
  }
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
  const double inv_gas = 1.0 / static_cast<double>(grad_divisor_);
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
    rr.fill_in_task = true;  // started while the shard group's reduce-scatters of the same slices are queued
    replica_reducer_ = std::make_unique<Reducer>(rr, device_, counters_, *groups_.replica.comm, *queue_);
  }
}

bool EngineImpl::replica_reduce_ready(const UnitState& u) const {
  // The window's last micro-step, u's scope closed, and the micro-step so far follows the recorded one, in which u
  // is not used again. The same decision on every rank: their orders are compared (a micro-step that departs from
  // the recorded order later and opens u again: reopen_replica_unit).
  return replica_reducer_ && schedule_ && micro_steps_ % gas_ == gas_ - 1 && u.open_scopes == 0 &&
         schedule_->following() && schedule_->next_use(u.info.id) < 0;
}

void EngineImpl::hand_replica_units(bool all) {
  // A unit's buckets are filled in their tasks (ReducerOptions::fill_in_task), queued after the shard group's bucket
  // that completes its slices (the queue's order; with streams, the reduce stream's). Its elements pack into the
  // replica reducer's buckets in the order the units finished, and each bucket launches when full, as DeepSpeed's
  // MiCS all-reduces each reduce bucket of the last micro-step; the sizes stay plan_traffic()'s.
  for (; replica_handed_ < replica_ready_.size(); ++replica_handed_) {
    const ReplicaReady& r = replica_ready_[replica_handed_];
    if (!all && r.shard_launches > reducer_->launches()) break;
    UnitState& u = units_[r.unit];
    replica_reducer_->add_all_reduce(u.info.name, u.grad_acc.data(), u.info.slice_numel);
    u.replica = ReplicaReduce::handed;
  }
}

void EngineImpl::reopen_replica_unit(UnitState& u) {
  // MiCS: u's gradients of this window were taken for final, the recorded schedule having no later use of u in
  // this micro-step. Not handed to the replica reducer yet, u goes back to step()'s declaration-order pass; handed,
  // its later gradients could not reach the replicas.
  const auto index = static_cast<size_t>(&u - units_.data());
  ZERO3_REQUIRE(u.replica != ReplicaReduce::handed, InvalidArgument, "Engine::backward_scope('", u.info.name,
                "'): the unit's backward scope opens again in the last micro-step of the accumulation window, after "
                "the recorded schedule (the micro-step before) said its gradients were final; they are already in "
                "the all-reduce across the MiCS replicas. Keep the order of the window's earlier micro-steps, or set "
                "zero_optimization.overlap_comm to false");
  std::erase_if(replica_ready_, [&](const ReplicaReady& r) { return r.unit == index; });
  u.replica = ReplicaReduce::at_boundary;
}

void EngineImpl::add_scope_grads(UnitState& u, const void* grads) {
  if (reduce_once_per_step_) {  // summed here; reduce-scattered at the boundary
    kernels_of(device_).scale_add(u.step_grads.data(), acc_dtype_, grads, acc_dtype_, 1.0f, u.info.numel, compute_);
  } else if (policy_.shard_grads) {
    reducer_->add_scatter(u.info.name, grads, u.info.slice_numel, u.grad_acc.data());
    if (replica_reduce_ready(u)) {
      // The window's last gradients of u: to the all-reduce across the replicas once the shard group's bucket holding
      // its last pieces is launched, overlapping the rest of backward (overlap_comm), as FSDP2's HSDP does per unit.
      u.replica = ReplicaReduce::ready;
      replica_ready_.push_back({static_cast<size_t>(&u - units_.data()),
                                reducer_->launches() + (reducer_->filling() ? 1 : 0)});
    }
    if (overlap_ && replica_handed_ < replica_ready_.size()) hand_replica_units(false);
  } else {
    kernels_of(device_).scale_add(u.grad_acc.data(), acc_dtype_, grads, acc_dtype_, 1.0f, u.info.numel, compute_);
  }
}

const void* EngineImpl::owned_grads(const UnitState& u) const {
  // Stage 2-3 accumulate the rank's slice only; stage 0-1 hold the full buffer.
  return policy_.shard_grads ? u.grad_acc.data() : element_ptr(u.grad_acc.data(), acc_dtype_, u.owned_begin);
}

void* EngineImpl::owned_grads(UnitState& u) {
  return const_cast<void*>(static_cast<const EngineImpl*>(this)->owned_grads(u));
}

void EngineImpl::zero_grads() {
  for (UnitState& u : units_) {
    device_.fill_zero(u.grad_acc.data(), u.grad_acc.bytes(), compute_);
    if (u.step_grads.allocated()) device_.fill_zero(u.step_grads.data(), u.step_grads.bytes(), compute_);
  }
}

void EngineImpl::reduce_at_boundary() {
  // Stage 0-1 accumulated locally over the window; one all-reduce per bucket now, in declaration order
  // (the same on every rank whatever order the scopes closed in).
  if (!policy_.shard_grads) {
    for (UnitState& u : units_) reducer_->add_all_reduce(u.info.name, u.grad_acc.data(), u.info.numel);
  }
  // A pipeline stage reducing once per step: the step's full gradients into the slices, in declaration order.
  if (reduce_once_per_step_) {
    for (UnitState& u : units_)
      reducer_->add_scatter(u.info.name, u.step_grads.data(), u.info.slice_numel, u.grad_acc.data());
  }
  // cpu: the reductions complete in their tasks. cuda: the compute stream waits for the reduce stream (join), the
  // host for nothing; the Works are checked at the boundary's read.
  reducer_->flush();
  if (replica_reducer_) {
    // MiCS: each shard group summed its ranks' gradients every micro-step; once per optimizer step the groups'
    // sums are summed across the replicas (the ranks holding the same slices): the units the last backward finished,
    // in that order (with overlap_comm most were handed over in backward), then the others (not used in it, or in a
    // micro-step that left the recorded order) in declaration order.
    hand_replica_units(true);
    for (UnitState& u : units_) {
      if (u.replica == ReplicaReduce::at_boundary) {
        replica_reducer_->add_all_reduce(u.info.name, u.grad_acc.data(), u.info.slice_numel);
      }
      u.replica = ReplicaReduce::at_boundary;
    }
    replica_reducer_->flush();
    replica_ready_.clear();
    replica_handed_ = 0;
  }
  if (gather_stream_ == nullptr) queue_->drain();
  reducer_->join();  // cuda: the compute stream reads the accumulators after the reduce stream wrote them
  if (replica_reducer_) replica_reducer_->join();
}

}  // namespace zero3::detail

// step(): the end of a micro-step and, at accumulation boundaries, the optimizer step.
//
//   flush the reducer ─► (stage 0-1: all-reduce the accumulators) ─► Inf/NaN count + sum of squares,
//   all-reduced ─► loss scaler decides: skip, or ─► clip coefficient ─► Adam on each owned range in
//   sub_group_size tiles, writing the compute copy in the same pass ─► all-gather the parameters
//   (stage 1-2) or the persistent units (stage 3) ─► zero the accumulators.
#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "device/device_kernels.hpp"
#include "optim/grad_norm.hpp"
#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

void EngineImpl::run_collective(const std::string& what, const std::function<void()>& fn) {
  auto ticket = queue_->submit(what, [&] {
    try {
      fn();
    } catch (const TimeoutError& e) {
      throw TimeoutError(log::concat(what, " on rank ", rank_, " failed: ", e.what()));
    } catch (const CommError& e) {
      throw CommError(log::concat(what, " on rank ", rank_, " failed: ", e.what()));
    }
  });
  queue_->wait(ticket);
}

const void* EngineImpl::owned_grads(const UnitState& u) const {
  // Stage 2-3 accumulate the rank's slice only; stage 0-1 hold the full buffer.
  return policy_.shard_grads ? u.grad_acc.data() : element_ptr(u.grad_acc.data(), acc_dtype_, u.owned_begin);
}

void* EngineImpl::owned_grads(UnitState& u) {
  return const_cast<void*>(static_cast<const EngineImpl*>(this)->owned_grads(u));
}

void EngineImpl::publish_params(UnitState& u) {
  // Stage 1-2: each rank updated its slice of `full`; the all-gather runs in place.
  const DType ct = u.info.dtype;
  const int64_t S = u.info.slice_numel;
  void* out = u.full.data();
  const void* in = element_ptr(u.full.data(), ct, u.owned_begin);
  Communicator* comm = comm_.get();
  run_collective(log::concat("all_gather of the parameters of unit '", u.info.name, "' (", u.info.padded_numel,
                             " elements, ", dtype_name(ct), ")"),
                 [=] { comm->all_gather_into(out, in, static_cast<size_t>(S), ct)->wait(); });
  stats_.gathered_elements += u.info.padded_numel;
}

void EngineImpl::zero_grads() {
  for (UnitState& u : units_) device_.fill_zero(u.grad_acc.data(), u.grad_acc.bytes());
}

void EngineImpl::reduce_at_boundary() {
  // Stage 0-1 accumulated locally over the window; one all-reduce per bucket now, in declaration order
  // (the same on every rank whatever order the scopes closed in).
  if (!policy_.shard_grads) {
    for (UnitState& u : units_) reducer_->add_all_reduce(u.info.name, u.grad_acc.data(), u.info.numel);
  }
  reducer_->flush();
  queue_->drain();
}

void EngineImpl::run_optimizer(const AdamStepConsts& consts, float grad_factor) {
  auto& k = device_.kernels();
  const int64_t tile = config_.zero.sub_group_size;
  DeviceBuffer f32_tile;  // gradients converted to fp32 when they accumulate in 16 bits
  for (UnitState& u : units_) {
    void* g_all = owned_grads(u);
    for (int64_t a = 0; a < u.owned_valid; a += tile) {
      int64_t n = std::min(tile, u.owned_valid - a);
      float* g;
      if (acc_dtype_ == DType::f32) {
        g = static_cast<float*>(g_all) + a;
        if (grad_factor != 1.0f) k.scale_copy(g, DType::f32, g, DType::f32, grad_factor, n);
      } else {
        if (f32_tile.bytes() < static_cast<size_t>(n) * sizeof(float)) {
          f32_tile = DeviceBuffer(device_, counters_, MemoryCategory::buffers,
                                  static_cast<size_t>(std::min(tile, u.owned_valid)) * sizeof(float));
        }
        g = f32_tile.as<float>();
        k.scale_copy(g, DType::f32, element_ptr(g_all, acc_dtype_, a), acc_dtype_, grad_factor, n);
      }
      void* copy_out = nullptr;
      const DType ct = u.info.dtype;
      if (ct != DType::f32) {
        copy_out = policy_.shard_params ? element_ptr(u.compute_slice.data(), ct, a)
                                        : element_ptr(u.full.data(), ct, u.owned_begin + a);
      }
      k.adam(u.master + a, g, u.exp_avg.as<float>() + a, u.exp_avg_sq.as<float>() + a, n, consts, copy_out, ct);
    }
  }
}

StepResult EngineImpl::step() {
  check_usable();
  require_materialized("step");
  if (open_scopes_ > 0) {
    std::string names;
    for (const UnitState& u : units_) {
      if (u.open_scopes > 0) names += (names.empty() ? "'" : ", '") + u.info.name + "'";
    }
    throw InvalidArgument("Engine::step: close every scope first; still open: " + names);
  }
  StepResult result;
  try {
    if (checking_order()) check_order(1 + 2 * static_cast<int64_t>(units_.size()), "step()");
    end_micro_step_schedule();
    reducer_->flush();
    queue_->drain();
    ++micro_steps_;
    ++local_micro_steps_;
    result.micro_step = micro_steps_;
    if (micro_steps_ % gas_ != 0) {
      result.loss_scale = loss_scaler_.scale();
      result.global_step = global_steps_;
      return result;
    }
    result.boundary = true;
    reduce_at_boundary();

    // Inf/NaN and the squared norm over this rank's owned ranges. At stage 0 every rank holds the same full
    // gradients, so max over ranks (of equal values) keeps them exact; sharded ranges are summed.
    double local[2] = {0.0, 0.0};
    for (const UnitState& u : units_) {
      GradStats s = device_.kernels().grad_stats(owned_grads(u), acc_dtype_, u.owned_valid);
      local[0] += static_cast<double>(s.non_finite);
      local[1] += s.sum_squares;
    }
    float agreed[2] = {static_cast<float>(local[0]), static_cast<float>(local[1])};
    if (!std::isfinite(agreed[1])) agreed[0] = std::max(agreed[0], 1.0f);
    ReduceOp op = policy_.shard_optimizer ? ReduceOp::sum : ReduceOp::max;
    Communicator* comm = comm_.get();
    run_collective("all_reduce of the gradient statistics (Inf/NaN count, squared norm)",
                   [&] { comm->all_reduce(agreed, 2, DType::f32, op)->wait(); });
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
      return result;
    }
    double coef = clip_coefficient(result.grad_norm, *config_.gradient_clipping);
    result.clip_coef = coef;
    ++applied_steps_;
    AdamStepConsts consts = adam_step_consts(hyper, applied_steps_);
    run_optimizer(consts, static_cast<float>(coef / scale));
    for (UnitState& u : units_) {
      if (policy_.shard_optimizer && !policy_.shard_params) publish_params(u);
      if (policy_.shard_params && u.info.persistent) {
        release_gather(u);
        issue_gather(u, false);
        wait_gather(u);
      }
    }
    zero_grads();
    result.applied = true;
    result.loss_scale = loss_scaler_.scale();
    if (config_.steps_per_print > 0 && global_steps_ % config_.steps_per_print == 0) {
      log::info_rank0("step ", global_steps_, ": lr ", result.lr, ", grad norm ", result.grad_norm,
                      result.clip_coef < 1.0 ? " (clipped)" : "", ", loss scale ", result.loss_scale, ", skipped ",
                      skipped_steps_, ", peak ", counters_.peak_total() >> 20, " MiB");
    }
  } catch (const CommError&) {
    fail(std::current_exception());
  }
  return result;
}

void EngineImpl::gather_master_params(UnitId unit, float* out) {
  check_usable();
  require_materialized("gather_master_params");
  UnitState& u = unit_state(unit, "gather_master_params");
  ZERO3_REQUIRE(out != nullptr, InvalidArgument, "Engine::gather_master_params: output is null for unit '", u.info.name,
                "'");
  if (!policy_.shard_optimizer) {
    device_.copy(out, u.master, static_cast<size_t>(u.info.numel) * sizeof(float));
    return;
  }
  DeviceBuffer all(device_, counters_, MemoryCategory::buffers, u.info.padded_numel * sizeof(float));
  const float* in = u.master;
  int64_t S = u.info.slice_numel;
  Communicator* comm = comm_.get();
  try {
    run_collective(log::concat("all_gather of the fp32 master parameters of unit '", u.info.name, "'"),
                   [&] { comm->all_gather_into(all.data(), in, static_cast<size_t>(S), DType::f32)->wait(); });
  } catch (const CommError&) {
    fail(std::current_exception());
  }
  device_.copy(out, all.data(), static_cast<size_t>(u.info.numel) * sizeof(float));
}

void EngineImpl::refresh_params() {
  check_usable();
  require_materialized("refresh_params");
  ZERO3_REQUIRE(open_scopes_ == 0, InvalidArgument, "Engine::refresh_params: close every scope first");
  try {
    for (UnitState& u : units_) {
      if (policy_.shard_params) release_gather(u);
      build_compute_copies(u);
    }
    queue_->drain();
  } catch (const CommError&) {
    fail(std::current_exception());
  }
}

}  // namespace zero3::detail

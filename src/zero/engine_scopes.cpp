// Scopes: entering a unit (the schedule check, its gather, a zeroed gradient buffer for backward) and closing it
// (the gradients to the reducer, the unit released or kept), and the views a scope hands out.
#include "core/check.hpp"
#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

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
    if (phase == Phase::backward && u.replica != ReplicaReduce::at_boundary) reopen_replica_unit(u);
    record_event(code);
    schedule_->record(event);
    if (policy_.shard_params) gather_for_entry(u);
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
    if (grads) add_scope_grads(u, grads);
    if (policy_.shard_params && u.open_scopes == 0 && !u.info.persistent) release_or_keep(u);
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

}  // namespace zero3::detail

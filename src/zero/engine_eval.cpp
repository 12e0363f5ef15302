// Evaluation: forward scopes between optimizer steps, with a schedule of their own.
//
// begin_eval swaps the training schedule out for the evaluation one, so scopes record into it, prefetch and
// keep units along its trace, and the training trace (and the micro-step it may be in the middle of recording)
// is left exactly as it was; end_eval swaps it back. Units are released at every batch end, as at every
// micro-step end in training, so neither mode finds the other's units gathered: begin_eval releases the training
// micro-step's first units that step() gathered ahead, and end_eval gathers them ahead again.
#include "core/check.hpp"
#include "zero/engine_impl.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

EvalMode EngineImpl::begin_eval() {
  check_usable();
  require_materialized("evaluate");
  ZERO3_REQUIRE(!evaluating_, InvalidArgument, "Engine::evaluate: the engine is already evaluating");
  ZERO3_REQUIRE(open_scopes_ == 0, InvalidArgument, "Engine::evaluate: close every scope first");
  ZERO3_REQUIRE(schedule_->current().empty(), InvalidArgument, "Engine::evaluate: a micro-step is under way (",
                schedule_->current().size(),
                " scopes entered since the last step()); evaluate between micro-steps, after step()");
  try {
    if (policy_.shard_params) {
      for (UnitState& u : units_) {
        if (!u.info.persistent) release_gather(u);
      }
      ahead_numel_ = 0;
    }
  } catch (...) {
    fail(std::current_exception());
  }
  std::swap(schedule_, eval_schedule_);
  evaluating_ = true;
  prefetch_param_reads();  // the slices of the evaluation's first units, from the second evaluation on
  return EvalMode(this);
}

void EngineImpl::next_eval_batch() {
  check_usable();
  ZERO3_REQUIRE(evaluating_, InvalidArgument, "EvalMode::next_batch: the engine is not evaluating");
  ZERO3_REQUIRE(open_scopes_ == 0, InvalidArgument, "EvalMode::next_batch: close every scope first");
  if (schedule_->current().empty()) return;  // no scope since the last batch: nothing to end
  try {
    verify_schedule("EvalMode::next_batch()");
    reset_events();
    end_micro_step_schedule(false);
    ++eval_batches_;
    prefetch_param_reads();
  } catch (...) {
    fail(std::current_exception());
  }
}

void EngineImpl::end_eval(EvalMode& mode) {
  ZERO3_REQUIRE(open_scopes_ == 0, InvalidArgument, "EvalMode::end: close every scope first");
  leave_eval(mode);
}

void EngineImpl::end_eval_noexcept(EvalMode& mode) noexcept {
  try {
    leave_eval(mode);
  } catch (const std::exception& e) {
    if (!deferred_error_) deferred_error_ = std::current_exception();
    log::error("ending evaluation failed (the next engine call rethrows it): ", e.what());
  } catch (...) {
    if (!deferred_error_) deferred_error_ = std::current_exception();
  }
}

void EngineImpl::leave_eval(EvalMode& mode) {
  mode.impl_ = nullptr;
  std::exception_ptr error;
  // With scopes still open (an EvalMode destroyed before them) the batch cannot end; they close in training.
  if (!fatal_error_ && open_scopes_ == 0) {
    try {
      next_eval_batch();
    } catch (...) {
      error = std::current_exception();
    }
  }
  std::swap(schedule_, eval_schedule_);
  evaluating_ = false;
  if (error) std::rethrow_exception(error);
  if (fatal_error_) return;
  try {
    prefetch_next_micro_step();
    prefetch_param_reads();  // the slices of the units after them
  } catch (...) {
    fail(std::current_exception());
  }
}

}  // namespace zero3::detail

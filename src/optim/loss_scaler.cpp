#include "optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {

LossScaler::LossScaler(const Fp16Config& fp16) {
  if (!fp16.enabled) return;  // bf16 / fp32: a static scale of 1
  ZERO3_REQUIRE(fp16.loss_scale >= 0 && std::isfinite(fp16.loss_scale), ConfigError,
                "fp16.loss_scale: ", fp16.loss_scale, " must be 0 (dynamic) or a positive finite scale");
  if (fp16.loss_scale > 0) {
    state_.cur_scale = fp16.loss_scale;
    return;
  }
  ZERO3_REQUIRE(fp16.initial_scale_power >= 0 && fp16.initial_scale_power < 1024, ConfigError,
                "fp16.initial_scale_power: ", fp16.initial_scale_power, " must be in [0, 1023]");
  ZERO3_REQUIRE(fp16.loss_scale_window >= 1, ConfigError, "fp16.loss_scale_window: ", fp16.loss_scale_window,
                " must be a positive integer");
  ZERO3_REQUIRE(fp16.hysteresis >= 1, ConfigError, "fp16.hysteresis: ", fp16.hysteresis, " must be a positive integer");
  ZERO3_REQUIRE(fp16.min_loss_scale > 0 && std::isfinite(fp16.min_loss_scale), ConfigError,
                "fp16.min_loss_scale: ", fp16.min_loss_scale, " must be a positive finite number");
  dynamic_ = true;
  scale_window_ = fp16.loss_scale_window;
  hysteresis_ = fp16.hysteresis;
  consecutive_hysteresis_ = fp16.consecutive_hysteresis;
  min_scale_ = fp16.min_loss_scale;
  state_.cur_scale = std::ldexp(1.0, static_cast<int>(fp16.initial_scale_power));
  state_.cur_iter = 0;
  state_.last_overflow_iter = -1;
  state_.cur_hysteresis = hysteresis_;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) return !overflow;
  LossScalerState& s = state_;
  if (overflow) {
    if (hysteresis_ == 1 || s.cur_hysteresis == 1) {
      ZERO3_REQUIRE(s.cur_scale != min_scale_, Error, "fp16 loss scale: gradients overflow at the minimum loss scale ",
                    min_scale_, " (fp16.min_loss_scale) with no hysteresis left; training cannot progress");
      double next = std::max(s.cur_scale / 2.0, min_scale_);
      log::info_rank0("fp16 overflow: skipping the step, loss scale ", s.cur_scale, " -> ", next);
      s.cur_scale = next;
    } else {
      log::info_rank0("fp16 overflow: skipping the step, loss scale stays ", s.cur_scale, ", hysteresis ",
                      s.cur_hysteresis, " -> ", s.cur_hysteresis - 1);
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
    // Good steps since the one right after the last overflow: the scale grows every scale_window of them.
    int64_t stable = s.cur_iter - s.last_overflow_iter - 1;
    if (stable > 0 && stable % scale_window_ == 0) {
      if (!consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
      s.cur_scale *= 2.0;
    }
  }
  s.cur_iter += 1;
  return !overflow;
}

void LossScaler::restore(const LossScalerState& state) {
  ZERO3_REQUIRE(state.cur_scale > 0 && std::isfinite(state.cur_scale), InvalidArgument,
                "LossScaler::restore: loss scale ", state.cur_scale, " is not a positive finite number");
  ZERO3_REQUIRE(!dynamic_ || (state.cur_hysteresis >= 1 && state.cur_iter >= 0), InvalidArgument,
                "LossScaler::restore: hysteresis ", state.cur_hysteresis, " and iteration ", state.cur_iter,
                " must be >= 1 and >= 0");
  state_ = state;
}

}  // namespace zero3

// Loss scaling for fp16, as DeepSpeed's LossScaler (static) and DynamicLossScaler behave.
//
// Static: fp16.loss_scale > 0 fixes the scale. Dynamic (fp16.loss_scale == 0): the scale starts at
// 2^initial_scale_power. On an overflow the step is skipped; the scale is divided by 2 (never below
// min_loss_scale) once `hysteresis` overflows have been absorbed, otherwise one unit of hysteresis is
// spent. After `loss_scale_window` good steps in a row beyond the one that follows the last overflow
// (DeepSpeed's stable_interval), the scale doubles and hysteresis is refilled. With
// consecutive_hysteresis every good step refills hysteresis. An overflow while the scale already sits at
// min_loss_scale and no hysteresis is left is an error (DeepSpeed raises too): training cannot progress.
//
// Without fp16 (bf16 or fp32 compute) the scale is a static 1 and update() only reports the skip.
// Every step with an overflow is skipped, static or dynamic. Not thread-safe: one owner (the engine).
#pragma once

#include <cstdint>

#include "zero3/config.hpp"

namespace zero3 {

// What a checkpoint must carry to resume the scaler exactly.
struct LossScalerState {
  double cur_scale = 1.0;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  int64_t cur_hysteresis = 1;
};

class LossScaler {
 public:
  // From the fp16 section. `fp16.enabled == false` gives the static scale 1. Throws ConfigError for a
  // negative loss_scale, a window or hysteresis < 1, or a non-positive min_loss_scale.
  explicit LossScaler(const Fp16Config& fp16);

  // The factor the loss (and so the gradients) is multiplied by in the coming step.
  double scale() const { return state_.cur_scale; }
  bool dynamic() const { return dynamic_; }

  // Records the outcome of one step (overflow: some gradient was Inf/NaN on some rank, already agreed
  // across ranks) and adjusts the scale. Returns true when the step is applied, false when skipped.
  // Throws zero3::Error when an overflow arrives at min_loss_scale with no hysteresis left.
  bool update(bool overflow);

  LossScalerState state() const { return state_; }
  // Restores a saved state. Throws InvalidArgument for a non-positive scale.
  void restore(const LossScalerState& state);

 private:
  bool dynamic_ = false;
  int64_t scale_window_ = 1000;
  int64_t hysteresis_ = 2;  // DeepSpeed's delayed_shift
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 1.0;
  LossScalerState state_;
};

}  // namespace zero3

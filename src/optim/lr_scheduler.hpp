// Learning-rate schedules with DeepSpeed's names, parameters and arithmetic: WarmupLR, WarmupDecayLR,
// WarmupCosineLR and OneCycle (plus "none": the optimizer's lr, constant).
//
// Step counting follows DeepSpeed exactly. DeepSpeed's scheduler holds `last_batch_iteration`, which starts
// at -1; the engine calls scheduler.step() after every optimizer step that was applied (not after a step
// skipped for overflow), and step() first increments the counter, then computes the lr that the *next*
// optimizer step uses. So the first optimizer step runs with the lr at iteration -1 (the construction-time
// lr), the second with the lr at iteration 0, and so on. Here that is a pure function of the counter:
//
//   int64_t it = -1;                          // DeepSpeed's last_batch_iteration; save it in checkpoints
//   for each optimizer step:
//     double lr = sched.lr_at(it);            // and beta1_at(it)/beta2_at(it) when they have a value
//     ... apply the step with lr, or skip it ...
//     if (applied) ++it;
//
// The schedulers are immutable after construction and safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zero3/config.hpp"

namespace zero3 {

class LrScheduler {
 public:
  virtual ~LrScheduler() = default;

  // The learning rate the optimizer uses while DeepSpeed's last_batch_iteration equals `it` (>= -1).
  virtual double lr_at(int64_t it) const = 0;

  // Adam's beta1 at `it`, when the schedule cycles momentum (OneCycle with cycle_momentum); nullopt
  // otherwise (keep the optimizer's beta1).
  virtual std::optional<double> beta1_at(int64_t it) const {
    (void)it;
    return std::nullopt;
  }

  // Adam's beta2 at `it`, when the schedule overrides it: DeepSpeed's OneCycle with cycle_momentum sets
  // the optimizer's betas to (momentum, 0.99), replacing the configured beta2. nullopt otherwise.
  virtual std::optional<double> beta2_at(int64_t it) const {
    (void)it;
    return std::nullopt;
  }

  // DeepSpeed's type name: "none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle".
  virtual std::string name() const = 0;
};

// Builds the schedule from config.scheduler and config.optimizer.lr (the base lr for "none" and
// WarmupCosineLR, and warmup_max_lr when that is unset). Throws ConfigError naming the key
// ("scheduler.params.total_num_steps: ...") when a needed value is missing, still "auto", or out of range.
std::unique_ptr<LrScheduler> make_lr_scheduler(const Config& config);

}  // namespace zero3

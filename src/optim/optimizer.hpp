// The optimizer section of the config as Adam/AdamW hyper-parameters (optim/adam_math.hpp), with
// DeepSpeed's meaning: "AdamW" is decoupled weight decay; "Adam" is decoupled too unless adam_w_mode is
// false, in which case the decay is an L2 term added to the gradient.
#pragma once

#include <cstdint>
#include <optional>

#include "optim/adam_math.hpp"
#include "optim/lr_scheduler.hpp"
#include "zero3/config.hpp"

namespace zero3 {

// Throws ConfigError naming the key when lr or weight_decay is still "auto", or a value is out of range
// (lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0).
AdamHyper adam_hyper_from_config(const Config& config);

// The hyper-parameters of the optimizer step taken while the scheduler's last_batch_iteration is `it`:
// `base` with the schedule's lr and, when it cycles momentum, its betas.
AdamHyper adam_hyper_at(const AdamHyper& base, const LrScheduler& schedule, int64_t it);

}  // namespace zero3

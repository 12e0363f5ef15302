// The micro-step counts of checkpoints against an engine's (checkpoint_ranks.hpp).
#include "checkpoint/checkpoint_ranks.hpp"
#include "checkpoint/manifest.hpp"
#include "zero3/log.hpp"

namespace zero3::ckpt {

int64_t micro_batches_per_micro_step(const Engine& engine) {
  const int64_t per_step = engine.config().gradient_accumulation_steps.value_or(1);
  const int64_t micro_steps = engine.gradient_accumulation_steps();
  return micro_steps > 0 && per_step % micro_steps == 0 ? per_step / micro_steps : 1;
}

TrainingState saved_training_state(const Engine& engine) {
  TrainingState state = engine.training_state();
  state.micro_steps *= micro_batches_per_micro_step(engine);
  return state;
}

TrainingState engine_training_state(const CheckpointInfo& info, const Engine& engine) {
  const TrainingState& saved = info.training_state;
  TrainingState state = saved;
  const int64_t batches = micro_batches_per_micro_step(engine);
  const int64_t gas = engine.gradient_accumulation_steps();
  // The count goes on where the saving run's engine would: the same micro-batches per optimizer step.
  const bool same_steps = saved_gradient_accumulation_steps(info) == engine.config().gradient_accumulation_steps;
  if (same_steps && saved.micro_steps % batches == 0 && (saved.micro_steps / batches) % gas == 0) {
    state.micro_steps = saved.micro_steps / batches;
  } else {
    state.micro_steps = saved.global_steps * gas;
    log::info_rank0("checkpoint micro-step count ", saved.micro_steps, " was counted with another ",
                    "gradient_accumulation_steps than this run's ", gas, " micro-step(s) of ", batches,
                    " micro-batch(es) per optimizer step; counting from micro-step ", state.micro_steps,
                    " (global step ", saved.global_steps, ")");
  }
  return state;
}

}  // namespace zero3::ckpt

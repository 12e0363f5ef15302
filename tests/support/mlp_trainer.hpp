// The equivalence tests' model trained through the engine: the same layers as reference_model.hpp, each
// unit used inside its forward and backward scope, exactly as a training program would.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/reference_model.hpp"
#include "zero3/engine.hpp"

namespace zero3::testing {

struct MlpUnits {
  UnitId fc1, norm, fc2, head;
};

// Declares the model's units and parameters (mlp_params) on `engine`.
MlpUnits declare_mlp(Engine& engine, const MlpDims& dims);

struct EngineRun {
  std::vector<double> losses;                        // this rank's micro-batch losses, in order
  std::vector<StepResult> steps;                     // every step() result (one per micro-step)
  std::map<std::string, std::vector<float>> params;  // final fp32 master weights by full name
};

// Runs plan.steps optimizer steps (plan.steps * gradient_accumulation_steps micro-steps) on this rank's
// share of the data. The engine must be materialized.
EngineRun train_mlp(Engine& engine, const MlpUnits& units, const TrainPlan& plan);

// One micro-step (forward, backward, no step()). Returns the loss. `plant` adds `plant_value` to the first
// gradient element of fc2.w (to inject Inf/NaN).
// The forward half of a micro-step (four forward scopes): fills act's a1, a1n, a2 and y.
void mlp_forward(Engine& engine, const MlpUnits& units, const MlpDims& dims, const Batch& batch, MlpActivations& act);
// The loss of `batch` without gradients: forward scopes only (what an evaluation runs).
double mlp_eval_loss(Engine& engine, const MlpUnits& units, const MlpDims& dims, const Batch& batch);

double mlp_micro_step(Engine& engine, const MlpUnits& units, const MlpDims& dims, const Batch& batch,
                      bool plant = false, float plant_value = 0.0f);

// The configuration of the equivalence runs: `stage`, AdamW (lr 2e-2, weight decay 0.01), 2 micro-steps per
// optimizer step, gradient clipping at 0.5, a linear WarmupLR over 4 steps, reduce buckets of 400 elements
// (several per step, units split across buckets), stage-3 persistence for units of up to 40 elements.
Config equivalence_config(int stage);

// Largest |a - b| / max(|b|, rms(b)) over the parameters (relative error with the tensor's RMS as floor, so
// weights that cross zero do not blow it up). Fails (returns +inf) when names or sizes differ.
double max_relative_error(const std::map<std::string, std::vector<float>>& a,
                          const std::map<std::string, std::vector<float>>& b, std::string* worst = nullptr);

// The full fp32 master weights of every parameter (collective).
std::map<std::string, std::vector<float>> gather_params(Engine& engine);

// This rank's fp32 master slice and Adam moments of every unit, back to back (local): to compare bit for bit.
std::vector<float> local_optimizer_state(Engine& engine);

}  // namespace zero3::testing

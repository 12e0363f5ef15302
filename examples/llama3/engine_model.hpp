// The Llama-3 model on a zero3::Engine: one unit per layer plus the embedding and the head, each used inside
// the engine's gather scopes, so the same code runs at ZeRO stage 0-3 on any number of ranks.
//
// Declaring (the constructor, before engine.materialize()):
//   units, in forward order: "embedding", "layers.0" ... "layers.<L-1>", "head"; parameters named as Hugging
//   Face names them (the unit's local names, e.g. "model.layers.3.mlp.up_proj.weight"), packed as
//   llama_layout.hpp says. Initial values either from the model config (the engine's meta init:
//   ParamInit::normal(initializer_range) for weights, ParamInit::ones for RMSNorm weights; each rank fills only
//   its slice with the engine's counter-based generator) or from Hugging Face safetensors (a file, a
//   directory or a sharded index; each rank reads only the byte ranges of its own slices).
//
// One micro-batch (forward_backward, collective at stage 3):
//   forward scopes   embedding, layers 0..L-1             (layer inputs kept; per-layer caches without checkpointing)
//   backward scopes  head (forward + loss + backward in one chunked pass), layers L-1..0, embedding
// With activation checkpointing, layer i's backward scope re-runs its forward from the kept input first.
//
// Precision. The model's arithmetic is float32 (the CPU kernels of llama_model.hpp). With a 16-bit compute
// dtype (bf16.enabled / fp16.enabled) the engine keeps 16-bit parameter copies (what is gathered and
// communicated) and fp32 master weights; each gathered unit is widened to float32 for the kernels, so
// activations and GEMMs are fp32 on bf16-rounded weights. Gradients are written in the engine's
// data_types.grad_accum_dtype (fp32 by default; a 16-bit accumulator receives the rounded fp32 result).
//
// Threads: one thread drives the model (the engine's rule); the kernels use OpenMP inside.
// Errors: zero3 errors from the engine (named unit, rank, collective); InvalidArgument for a bad batch;
// IoError for a safetensors file whose tensors do not match the model (named tensor and shapes).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "llama_layout.hpp"
#include "llama_model.hpp"
#include "model_config.hpp"
#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/safetensors.hpp"

namespace llama3 {

struct EngineModelOptions {
  bool activation_checkpointing = true;
  // Hugging Face safetensors to start from (file, directory or *.index.json); empty: init from the config.
  std::filesystem::path init_from;
};

// Seconds spent since the last reset, summed over micro-batches. The time blocked on collectives inside them
// is the engine's ScheduleStats::comm_wait_seconds.
struct PhaseTimes {
  double forward = 0;   // embedding and layer forwards, scope entries and exits included
  double backward = 0;  // head, layer backwards (with recomputation) and embedding backward, scopes included
  int64_t micro_batches = 0;
};

class EngineModel {
 public:
  // Declares the units on `engine`, which must not be materialized yet. Throws zero3::Unsupported for tied
  // embeddings, zero3::IoError when options.init_from lacks a parameter or holds one of another shape.
  EngineModel(zero3::Engine& engine, const ModelConfig& config, const EngineModelOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const std::vector<UnitLayout>& layouts() const { return layouts_; }
  zero3::UnitId unit(size_t index) const { return units_.at(index); }
  size_t num_units() const { return units_.size(); }
  bool activation_checkpointing() const { return checkpointing_; }
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

  // One micro-batch, forward and backward (collective at stage 3; every rank calls it with the same shape).
  // ids and targets are (batch, seq), row-major; targets are already shifted (position t predicts targets[t],
  // kIgnoreIndex skips). The loss is loss.normalizer-normalised (see LossOptions); gradients reach the engine
  // as each backward scope closes, and the caller then calls engine.step(). With fp16 the gradients are those
  // of the loss times engine.loss_scale() (the engine unscales them at the step); the returned loss is not
  // scaled.
  LossResult forward_backward(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                              const LossOptions& loss = {});

  // Collective: unit `index`'s full fp32 master parameters, layouts()[index].numel floats, into host memory.
  void gather_unit(size_t index, float* out);

  // Collective: writes the model's parameters into `dir` as Hugging Face safetensors (model.safetensors, or
  // shards of at most max_shard_bytes and model.safetensors.index.json) in `dtype` (f32 or bf16), plus
  // config.json when config_json is not empty. Units are gathered one at a time; only rank 0 holds one and
  // writes. Returns the bytes written on rank 0 (0 elsewhere).
  uint64_t save_hf(const std::filesystem::path& dir, zero3::safetensors::Dtype dtype, uint64_t max_shard_bytes,
                   const std::string& config_json = "");

  const PhaseTimes& times() const { return times_; }
  void reset_times() { times_ = {}; }
  // Host bytes the activations, caches and float staging of the last micro-batch held at their peak.
  int64_t activation_bytes() const { return activation_bytes_; }

 private:
  const float* params_f32(const zero3::UnitScope& scope, std::vector<float>& staging) const;
  float* grads_f32(const zero3::UnitScope& scope, std::vector<float>& staging) const;
  void commit_grads(const zero3::UnitScope& scope, const std::vector<float>& staging) const;

  zero3::Engine& engine_;
  ModelConfig config_;
  std::vector<UnitLayout> layouts_;
  std::vector<zero3::UnitId> units_;
  bool checkpointing_ = true;

  // Per-batch state, reused across micro-batches of the same shape.
  BatchShape rope_shape_{};
  std::unique_ptr<RopeTable<float>> rope_;
  std::vector<std::vector<float>> resid_;  // (L + 1) x (tokens, hidden): layer inputs, then the final states
  std::vector<LayerCache<float>> caches_;  // one (checkpointing) or L
  LayerWorkspace<float> ws_;
  std::vector<float> dx_;  // (tokens, hidden)
  std::vector<float> param_staging_, grad_staging_;

  PhaseTimes times_;
  int64_t activation_bytes_ = 0;
};

// The LossOptions::normalizer that turns the engine's average over ranks and micro-batches into the mean over
// every non-ignored target of the optimizer step: (targets of the step on all ranks) / (world x micro-batches).
// Collective (an all-reduce of the counts, exact up to 2^32 targets per step). `local_targets`: this rank's
// non-ignored targets summed over its `micro_batches` micro-batches of the step. Returns 0 when no rank has any.
double step_loss_normalizer(zero3::Communicator& comm, int64_t local_targets, int64_t micro_batches);

// The units exactly as EngineModel declares them, for zero3::plan_memory.
zero3::ModelDesc engine_model_desc(const ModelConfig& config, const std::string& name = "llama");

// What one rank's activations take during a micro-batch of `shape`, by part (bytes at `element_bytes` per
// activation element), as EngineModel allocates them:
struct ActivationEstimate {
  int64_t layer_inputs = 0;  // L + 1 residual streams (the only per-layer state with checkpointing)
  int64_t layer_caches = 0;  // one LayerCache (checkpointing) or L of them
  int64_t workspace = 0;     // LayerWorkspace, the head's normalised states and dx
  int64_t loss_chunk = 0;    // one chunk of logits in the chunked cross-entropy
  int64_t unit_staging = 0;  // float copies of one gathered unit and its gradients (16-bit compute only)
  int64_t total() const { return layer_inputs + layer_caches + workspace + loss_chunk + unit_staging; }
};

// element_bytes: 4 for the CPU path (float32 activations), 2 for a bf16 activation path.
// widen_units: the compute dtype is 16-bit and the kernels take float32 (CPU path).
ActivationEstimate estimate_activations(const ModelConfig& config, const BatchShape& shape, bool checkpointing,
                                        int64_t element_bytes, bool widen_units);

}  // namespace llama3

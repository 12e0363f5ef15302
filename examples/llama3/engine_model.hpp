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
// One micro-batch (forward_backward, collective at stage 3), run by a ModelRunner (model_runner.hpp) on the
// backend of the engine's device (make_model_ops: CpuModelOps on cpu, CudaModelOps on cuda):
//   forward scopes   embedding, layers 0..L-1             (layer inputs kept; per-layer caches without checkpointing)
//   backward scopes  head (forward + loss + backward in one chunked pass), layers L-1..0, embedding
// With tied embeddings (tie_word_embeddings) the LM head is the embedding's weight: the head's scope opens a
// second scope on the embedding unit inside it (a backward scope in training, a forward scope in evaluation), so
// that unit is entered twice per micro-batch in each direction and the engine adds its two gradients.
// With activation checkpointing, layer i's backward scope re-runs its forward from the kept input first.
//
// Precision. Activations are the backend's act dtype: f32 on cpu (the kernels of ops/*.hpp; the same bits as
// llama_model.cpp's model_forward_backward), the engine's compute dtype on cuda (f32 or bf16; fp16 on cuda is
// zero3::Unsupported). A gathered unit whose dtype is not act (16-bit parameters on cpu) is converted into a
// staging buffer first (on cpu: widened to f32, so activations and GEMMs are f32 on bf16-rounded weights).
// Weight gradients are computed in f32; when data_types.grad_accum_dtype is 16-bit they go through an f32
// staging buffer and are rounded into the engine's buffer when the scope closes.
//
// Threads: one thread drives the model (the engine's rule); the cpu kernels use OpenMP inside; on cuda the
// work is queued on the device's default stream; the host waits for the loss once per micro-batch, or, with
// LossOptions::defer_loss_sum, only in take_loss_sum() (train_main: once per optimizer step).
// Errors: zero3 errors from the engine (named unit, rank, collective); InvalidArgument for a bad batch;
// IoError for a safetensors file whose tensors do not match the model (named tensor and shapes);
// Unsupported for a device or dtype the backends lack.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/model_ops.hpp"
#include "llama_layout.hpp"
#include "llama_model.hpp"
#include "model_config.hpp"
#include "model_runner.hpp"
#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/safetensors.hpp"

namespace llama3 {

struct EngineModelOptions {
  bool activation_checkpointing = true;
  // Hugging Face safetensors to start from (file, directory or *.index.json); empty: init from the config.
  std::filesystem::path init_from;
  // Tensors of init_from that are no parameter of the model (old rotary_emb.inv_freq buffers, another model's
  // weights): named in a warning, or, when set, an error.
  bool init_from_strict = false;
  // End the forward and the backward with a wait for the device, so that PhaseTimes are the GPU's (DeepSpeed's
  // wall_clock_breakdown synchronizes its timers the same way). Off, nothing waits and on cuda the times are
  // the host's queueing.
  bool time_phases = false;
};

// Seconds spent since the last reset, summed over micro-batches. The time blocked on collectives inside them
// is the engine's ScheduleStats::comm_wait_seconds. On cuda the times are the GPU's with
// EngineModelOptions::time_phases, the host's queueing without.
struct PhaseTimes {
  double forward = 0;   // embedding and layer forwards, scope entries and exits included
  double backward = 0;  // head, layer backwards (with recomputation) and embedding backward, scopes included
  int64_t micro_batches = 0;
};

class EngineModel {
 public:
  // Declares the units on `engine`, which must not be materialized yet, and makes the backend of its device.
  // Throws zero3::Unsupported for a device/dtype without a backend (fp16 or 16-bit gradients other than bf16 on
  // cuda), zero3::IoError when options.init_from lacks a parameter or holds one of another shape (or, with
  // init_from_strict, a tensor that is no parameter). With tied embeddings the file needs no lm_head.weight
  // (Hugging Face's tied checkpoints have none); one that is there is not read (the head uses
  // model.embed_tokens.weight, as transformers does), and rank 0 says so. NaN or Inf in init_from's weights is
  // refused while materialize() reads them (zero3::safetensors::make_f32_reader).
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
  // scaled. With loss.defer_loss_sum the result's loss and loss_sum are NaN and take_loss_sum() reads the sum
  // later (model_runner.hpp).
  LossResult forward_backward(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                              const LossOptions& loss = {});

  // One micro-batch's loss without gradients (collective at stage 3), inside the engine's evaluation
  // (Engine::evaluate(); zero3::InvalidArgument otherwise): the forward scopes of the embedding, the layers
  // and the head, activations kept one layer at a time. ids, targets and the loss as forward_backward; fp16's
  // loss scale plays no part.
  LossResult evaluate(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                      const LossOptions& loss = {});

  // The sum of the deferred micro-batches' losses (loss_sum, unnormalised) since the last take, in call order, in
  // double: the bits of adding their loss_sum on the host. 0 when none. On cuda one 8-byte read and one wait.
  double take_loss_sum() { return runner_->take_loss_sum(); }

  // Collective: unit `index`'s full fp32 master parameters, layouts()[index].numel floats, into host memory.
  void gather_unit(size_t index, float* out);

  // Collective: writes the model's parameters into `dir` as Hugging Face safetensors (model.safetensors, or
  // shards of at most max_shard_bytes and model.safetensors.index.json) in `dtype` (f32 or bf16), plus
  // config.json when config_json is not empty: that text with its "torch_dtype" or "dtype" set to the tensors'
  // dtype (exported_config_json). With tied embeddings there is no lm_head.weight,
  // Hugging Face's tied layout. Units are gathered one at a time; only rank 0 holds one and writes. Returns the
  // bytes written on rank 0 (0 elsewhere).
  uint64_t save_hf(const std::filesystem::path& dir, zero3::safetensors::Dtype dtype, uint64_t max_shard_bytes,
                   const std::string& config_json = "");

  const PhaseTimes& times() const { return times_; }
  void reset_times() { times_ = {}; }
  // Bytes the runner has allocated at its peak (layer inputs, caches, workspace, batch, dtype staging), in the
  // backend's memory: host memory on cpu, device memory on cuda (where the kernels' own workspaces,
  // ops().workspace_bytes(), come from the same Device and count in its bytes_in_use).
  int64_t activation_bytes() const { return runner_->peak_allocated_bytes(); }
  ModelOps& ops() const { return *ops_; }

 private:
  void check_shape(const BatchShape& shape, const char* what) const;
  // A scope's parameters in the backend's act dtype and its f32 gradient buffer, through the runner's staging
  // slot `slot` when the engine's dtypes differ (slot 1: the embedding inside the head's scope, tied).
  const void* params_act(const zero3::UnitScope& scope, int slot = 0);
  float* grads_f32(const zero3::UnitScope& scope, int slot = 0);
  void commit_grads(const zero3::UnitScope& scope, int slot = 0);

  zero3::Engine& engine_;
  ModelConfig config_;
  std::vector<UnitLayout> layouts_;
  std::vector<zero3::UnitId> units_;
  bool time_phases_;
  bool checkpointing_ = true;

  std::unique_ptr<ModelOps> ops_;
  std::unique_ptr<ModelRunner> runner_;  // per-batch buffers, reused across micro-batches

  PhaseTimes times_;
};

// What EngineModel's constructor does before it declares its units, for a program that declares them itself (a
// pipeline stage declares its own layers: pipeline_model.hpp).
// zero3::Unsupported for gradients the backend of `engine`'s device cannot accumulate (fp16 on cuda).
void check_gradient_dtype(zero3::Engine& engine);
// options.init_from opened and checked against every parameter of the model (missing tensors and wrong shapes are
// zero3::IoError; unknown tensors a warning, or with init_from_strict an error); null when init_from is empty.
std::shared_ptr<const zero3::safetensors::ShardedSafetensorsReader> open_init_weights(
    const ModelConfig& config, const EngineModelOptions& options);
// Declares `layout` as a unit of `engine`: its values read from `weights`, or (null) the config's initializers.
zero3::UnitId declare_unit(zero3::Engine& engine, const UnitLayout& layout,
                           const std::shared_ptr<const zero3::safetensors::ShardedSafetensorsReader>& weights);

// An open scope's parameters in the backend's act dtype, and its f32 gradient buffer (zeroed), through `staging`'s
// slot `slot` when the engine's dtypes differ; commit_scope_grads rounds the staged gradients into the engine's
// buffer (before the scope closes).
const void* scope_params_act(ModelRunner& staging, const zero3::UnitScope& scope, int slot = 0);
float* scope_grads_f32(ModelRunner& staging, const zero3::UnitScope& scope, int slot = 0);
void commit_scope_grads(ModelRunner& staging, const zero3::UnitScope& scope, int slot = 0);

// The LossOptions::normalizer that turns the engine's average over ranks and micro-batches into the mean over
// every non-ignored target of the optimizer step: (targets of the step on all ranks) / (world x micro-batches).
// Collective (an all-reduce of the counts through Engine::all_reduce_host, in the engine's order of collectives;
// exact up to 2^32 targets per step). `local_targets`: this rank's non-ignored targets summed over its
// `micro_batches` micro-batches of the step. Returns 0 when no rank has any.
double step_loss_normalizer(zero3::Engine& engine, int64_t local_targets, int64_t micro_batches);

// The units exactly as EngineModel declares them, for zero3::plan_memory.
zero3::ModelDesc engine_model_desc(const ModelConfig& config, const std::string& name = "llama");

// What one rank's activations take during a micro-batch of `shape`, by part, as EngineModel allocates them on a
// `device` whose engine computes in `compute` and accumulates gradients in `grads`: zero3::estimate_activations
// (zero3/activation_plan.hpp), the figure `zero3 plan` counts. Activations are f32 on cpu and `compute` on cuda
// (ModelOps::act; f16 is counted at 2 bytes although the cuda backend refuses it).
using ActivationEstimate = zero3::ActivationEstimate;
ActivationEstimate estimate_activations(const ModelConfig& config, const BatchShape& shape, bool checkpointing,
                                        zero3::DeviceType device, zero3::DType compute,
                                        zero3::DType grads = zero3::DType::f32);

}  // namespace llama3

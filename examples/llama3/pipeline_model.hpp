// The Llama-3 model cut into pipeline stages (zero3/pipeline_engine.hpp, docs/pipeline.md): what llama3_train
// runs with --pipeline-stages N.
//
// Layers (pipeline_layers): "embedding", "layers.0" .. "layers.<L-1>", "head" (final norm, LM head and loss), the
// units EngineModel declares, in the same order, with the same names and parameters: pipeline.partition cuts them
// into stages. Every boundary carries the residual stream, micro-batch x seq x hidden elements.
//
// The boundary dtype (PipelineOptions::activation_dtype, what crosses between stages): by default the backend's
// activation dtype, so a boundary is a copy and the pipelined run equals the unpipelined one up to round-off; given
// another (llama3_train: the compute dtype, as DeepSpeed's pipeline sends a bf16 model's activations in bf16), the
// stage converts its output and its input gradient into it and back on the other side, which rounds the residual
// stream there (on the CPU backend, whose activations are fp32, to bf16's 8 bits of mantissa).
//
// One stage on one micro-batch, with the ops EngineModel runs (model_runner.hpp) inside the stage engine's scopes:
//   forward   the stage's input (the embedding's forward scope on the first stage, the received activation
//             elsewhere), its layers' forward scopes, then either its output (sent on) or, on the last stage, the
//             head's backward scope: forward, loss and backward in one chunked pass, as EngineModel does, so the
//             loss is returned from forward() and the gradient into the head's input waits for backward()
//   backward  the received gradient of the output (the head's, on the last stage), the layers' backward scopes in
//             reverse (recomputing each layer's forward from its kept input with activation checkpointing), then
//             the embedding's backward scope, or the gradient of the stage's input (sent back)
// A stage keeps a ModelRunner per micro-batch in flight, over the stage's layers only (ModelRunner::set_layer_range:
// their inputs and the stage's output, or with activation checkpointing off all their caches; its workspace and its
// boundary gradient) from the forward to the backward of that micro-batch; released runners are reused (a reused
// runner keeps its largest buffers), so a rank holds as many as its schedule has micro-batches in flight at once
// (1F1B: at most the stages after it plus one; GPipe: all of the step's).
//
// Data. Micro-batch data_index of a data-parallel rank is the MicroBatchSource's; llama3_train's source picks the
// sequences the unpipelined run's micro-step data_index % micro_batches of step data_index / micro_batches picks
// on the same data-parallel rank. The loss is the unpipelined run's: every micro-batch's loss sum divided by the
// step's normalizer (step_loss_normalizer: the non-ignored targets of the whole global batch over data-parallel
// ranks x micro-batches), which the last stage counts from the source itself (every rank's micro-batches of the
// step), with no communication. So the mean of the micro-batch losses that PipelineEngine reports is the mean over
// every target of the global batch, and the gradients are the unpipelined run's up to round-off.
//
// Activation checkpointing: EngineModelOptions::activation_checkpointing, or every layer when the config's
// pipeline.activation_checkpoint_interval is 1 (PipelineStageInfo); an interval above 1 is a ConfigError (the
// runner recomputes every layer or none).
//
// Tied embeddings (tie_word_embeddings) need the embedding and the head on one stage engine (the head's scope
// opens the embedding's inside it, as EngineModel does): with pipeline.stages above 1 they are on different ranks,
// which is refused (zero3::ConfigError) before anything is declared.
//
// Evaluation (PipelineEngine::eval_batch(), PipelineCall::training false): forward scopes only, the head's forward
// scope and its loss on the last stage, nothing kept. Its micro-batches come from the source set_evaluation() names,
// and each returns its loss sum over the evaluation's normalizer (every rank's non-ignored targets of one evaluation
// over data-parallel ranks x micro-batches per evaluation), so the mean of the eval_batch() results of one evaluation
// is the mean over every target, as llama3_train's unpipelined evaluation computes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "backend/model_ops.hpp"
#include "data/micro_batches.hpp"
#include "engine_model.hpp"
#include "llama_layout.hpp"
#include "model_config.hpp"
#include "model_runner.hpp"
#include "zero3/device.hpp"
#include "zero3/pipeline_engine.hpp"

namespace llama3 {

// The layers PipelineEngine partitions: the model's units (model_unit_layouts) with their parameter counts, each
// with output_numel = shape.batch x shape.seq x hidden (the head's is not used).
std::vector<zero3::PipelineLayer> pipeline_layers(const ModelConfig& config, const BatchShape& shape);

// The refusal of a model whose embedding and head cannot share a stage engine: zero3::ConfigError when the
// embeddings are tied and `pipeline_ranks` (pipeline.stages) is above 1.
void check_pipeline_model(const ModelConfig& config, int pipeline_ranks);

class PipelineStageModel : public zero3::PipelineModel {
 public:
  // `device` and `compute`: the stage engine's (the backend is made here, so that boundary_dtype() is known
  // before the PipelineEngine is). `boundary`: the dtype between stages (nullopt: the backend's activation dtype).
  // `micro_batches`: gradient_accumulation_steps; `data_parallel_size`: the ranks of a stage (the world over
  // pipeline.stages); `pipeline_ranks`: pipeline.stages. options.time_phases,
  // activation_checkpointing, init_from and init_from_strict as EngineModel's. `data` must outlive the model.
  // Throws what check_pipeline_model and make_model_ops throw; IoError for a bad options.init_from.
  PipelineStageModel(const ModelConfig& config, const BatchShape& shape, MicroBatchSource& data, int64_t micro_batches,
                     int data_parallel_size, int pipeline_ranks, zero3::Device& device, zero3::DType compute,
                     std::optional<zero3::DType> boundary = std::nullopt, const EngineModelOptions& options = {});
  ~PipelineStageModel() override;

  // The dtype of the activations and their gradients between stages (PipelineOptions::activation_dtype).
  zero3::DType boundary_dtype() const { return boundary_; }

  // The held-out micro-batches of eval_batch(), `per_evaluation` per data-parallel rank in one evaluation (a
  // multiple of the micro-batches of one eval_batch()). `source` must outlive the model. Without it, a forward in
  // evaluation is zero3::InvalidArgument.
  void set_evaluation(MicroBatchSource& source, int64_t per_evaluation);

  void declare(zero3::Engine& engine, const zero3::PipelineStageInfo& stage) override;
  double forward(zero3::Engine& engine, const zero3::PipelineCall& call) override;
  void backward(zero3::Engine& engine, const zero3::PipelineCall& call) override;

  // Whether this rank's stages hold layer `layer` (an index into pipeline_layers()), and its unit on the stage
  // engine (zero3::InvalidArgument when not held).
  bool holds_layer(size_t layer) const { return layer < declared_.size() && declared_[layer]; }
  zero3::UnitId layer_unit(size_t layer) const { return unit(layer, "layer_unit"); }

  const ModelConfig& config() const { return config_; }
  ModelOps& ops() const { return *ops_; }
  const PhaseTimes& times() const { return times_; }
  void reset_times() { times_ = {}; }
  // Bytes the stage's runners hold at their peak, summed (one runner per micro-batch in flight at once), in the
  // backend's memory.
  int64_t activation_bytes() const;
  // The most micro-batches this rank had in flight at once (each holding a runner).
  int64_t peak_in_flight() const { return peak_in_flight_; }

 private:
  using RunnerKey = std::pair<int, int64_t>;  // (stage, micro-batch)
  std::unique_ptr<ModelRunner> take_runner(const zero3::PipelineStageInfo& stage);
  double evaluate(zero3::Engine& engine, const zero3::PipelineCall& call);
  void forward_layers(zero3::Engine& engine, ModelRunner& runner, const zero3::PipelineCall& call);
  ModelRunner& start_micro_batch(const zero3::PipelineCall& call);
  ModelRunner& running(const zero3::PipelineCall& call, const char* what);
  void finish_micro_batch(const zero3::PipelineCall& call);
  double head(zero3::Engine& engine, ModelRunner& runner, int64_t data_index);
  double step_normalizer(int64_t step);
  void check_boundary(const zero3::TensorView& view, const char* what, const zero3::PipelineCall& call) const;
  // Boundary tensors, in boundary_dtype(), through conversion_ where it is not the backend's activation dtype: a
  // received one in the backend's dtype, the stage's output and its input's gradient written into `view`.
  const void* from_boundary(const zero3::TensorView& view);
  void store_output(ModelRunner& runner, int64_t layer, const zero3::TensorView& view);
  void store_input_grad(ModelRunner& runner, const zero3::TensorView& view);
  zero3::UnitId unit(size_t layer, const char* what) const;

  ModelConfig config_;
  BatchShape shape_;
  MicroBatchSource& data_;
  int64_t micro_batches_;
  int data_parallel_size_;
  bool checkpointing_;
  bool time_phases_;
  EngineModelOptions options_;
  std::vector<UnitLayout> layouts_;
  std::vector<zero3::UnitId> units_;  // by layer; declared_[i] says whether this rank holds layer i
  std::vector<bool> declared_;
  std::shared_ptr<const zero3::safetensors::ShardedSafetensorsReader> weights_;
  bool weights_opened_ = false;

  std::unique_ptr<ModelOps> ops_;
  zero3::DType boundary_;
  void* conversion_ = nullptr;            // micro-batch x seq x hidden of the backend's dtype, where boundary_ differs
  std::unique_ptr<ModelRunner> staging_;  // dtype staging of a scope's units (no batch runs on it)
  std::map<RunnerKey, std::unique_ptr<ModelRunner>> in_flight_;
  std::vector<std::unique_ptr<ModelRunner>> idle_;
  int64_t peak_in_flight_ = 0;

  std::vector<int32_t> ids_, targets_;  // one micro-batch
  int64_t normalizer_step_ = -1;
  double normalizer_ = 0;
  MicroBatchSource* eval_data_ = nullptr;
  int64_t eval_per_evaluation_ = 0;
  double eval_normalizer_ = -1;  // counted at the first evaluation
  PhaseTimes times_;
};

}  // namespace llama3

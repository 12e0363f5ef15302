// The Llama-3 model cut into pipeline stages (zero3/pipeline_engine.hpp, docs/pipeline.md): what llama3_train
// runs with --pipeline-stages N.
//
// Layers (pipeline_layers): "embedding", "layers.0" .. "layers.<L-1>", "head" (final norm, LM head and loss), the
// units EngineModel declares, in the same order, with the same names and parameters: pipeline.partition cuts them
// into stages. Every boundary carries the residual stream, micro-batch x seq x hidden elements.
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
// Tied embeddings (tie_word_embeddings) need the embedding and the head on one stage engine (the head's scope
// opens the embedding's inside it, as EngineModel does): with pipeline.stages above 1 they are on different ranks,
// which is refused (zero3::ConfigError) before anything is declared. Evaluation (Engine::evaluating()) is not
// supported: zero3::Unsupported.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
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
  // `device` and `compute`: the stage engine's (the backend is made here, so that activation_dtype() is known
  // before the PipelineEngine is). `micro_batches`: gradient_accumulation_steps; `data_parallel_size`: the
  // ranks of a stage (the world over pipeline.stages); `pipeline_ranks`: pipeline.stages. options.time_phases,
  // activation_checkpointing, init_from and init_from_strict as EngineModel's. `data` must outlive the model.
  // Throws what check_pipeline_model and make_model_ops throw; IoError for a bad options.init_from.
  PipelineStageModel(const ModelConfig& config, const BatchShape& shape, MicroBatchSource& data,
                     int64_t micro_batches, int data_parallel_size, int pipeline_ranks, zero3::Device& device,
                     zero3::DType compute, const EngineModelOptions& options = {});
  ~PipelineStageModel() override;

  // The dtype of the activations between stages (PipelineOptions::activation_dtype): the backend's (f32 on cpu,
  // the compute dtype on cuda), so that a boundary is a copy.
  zero3::DType activation_dtype() const { return ops_->act(); }

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
  ModelRunner& start_micro_batch(const zero3::PipelineCall& call);
  ModelRunner& running(const zero3::PipelineCall& call, const char* what);
  void finish_micro_batch(const zero3::PipelineCall& call);
  double head(zero3::Engine& engine, ModelRunner& runner, int64_t data_index);
  double step_normalizer(int64_t step);
  void check_boundary(const zero3::TensorView& view, const char* what, const zero3::PipelineCall& call) const;
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
  std::unique_ptr<ModelRunner> staging_;  // dtype staging of a scope's units (no batch runs on it)
  std::map<RunnerKey, std::unique_ptr<ModelRunner>> in_flight_;
  std::vector<std::unique_ptr<ModelRunner>> idle_;
  int64_t peak_in_flight_ = 0;

  std::vector<int32_t> ids_, targets_;  // one micro-batch
  int64_t normalizer_step_ = -1;
  double normalizer_ = 0;
  PhaseTimes times_;
};

}  // namespace llama3

// Pipeline parallelism with ZeRO inside every stage (docs/pipeline.md).
//
// A sequential model's layers are cut into stages (pipeline.partition, as DeepSpeed's PipelineModule cuts them);
// each pipeline rank holds one stage (or, interleaved, several), and each stage runs on its own data-parallel group
// of ranks under ZeRO stage 0-3 with everything an Engine does (prefetch, offload, buckets, agreement checks).
// Micro-batches stream through the stages following a schedule (zero3/pipeline_schedule.hpp: GPipe, 1F1B,
// interleaved 1F1B): a stage receives its input activation from the stage before it, runs its layers and sends
// its output on; the gradients come back the same way. The micro-batches of one optimizer step are the config's
// gradient_accumulation_steps; train_batch_size = micro x accumulation x data-parallel size (the world over
// pipeline.stages), as DeepSpeed's. The global gradient norm, clipping and the Inf/NaN skip are decided over all
// stages together, so every rank takes the same step; the step equals the unpipelined engine's over the same
// global batch up to round-off.
//
// The program describes its layers and implements the stages' computation; the pipeline engine runs the schedule:
//
//   struct Mlp : zero3::PipelineModel {
//     void declare(zero3::Engine& e, const zero3::PipelineStageInfo& s) override {
//       for (size_t l = s.first_layer; l < s.end_layer; ++l) e.add_unit(layer_name(l), layer_params(l));
//     }
//     double forward(zero3::Engine& e, const zero3::PipelineCall& c) override {
//       // c.input: the previous stage's output (first stage: read micro-batch c.data_index's samples yourself);
//       // run the stage's layers in their forward scopes, keep what backward needs (keyed by c.micro_batch),
//       // write c.output (last stage: return the micro-batch's loss instead).
//     }
//     void backward(zero3::Engine& e, const zero3::PipelineCall& c) override {
//       // c.grad_output: d loss / d output (last stage: start from the loss, times e.loss_scale());
//       // backward scopes in reverse; write c.grad_input (not on the first stage).
//     }
//   };
//   std::vector<zero3::PipelineLayer> layers = {{"fc1", 13 * 37 + 37, 37}, ...};
//   Mlp model;
//   zero3::PipelineEngine pipe(config, world, device, layers, model);  // collective: groups, declare, materialize
//   for (int step = 0; step < 100; ++step) {
//     zero3::PipelineStepResult r = pipe.train_batch();  // the schedule's forwards, backwards, transfers and step()
//     if (pipe.world_rank() == 0) printf("loss %f\n", r.loss);
//   }
//
// Inside forward() and backward() use the Engine you are handed as any engine (scopes of the stage's units,
// loss_scale(), rank() and world_size() of the stage's data-parallel group); do not call its step() or
// all_reduce_host(): train_batch() does. Micro-batch data: the unpipelined engine's micro-step k of optimizer step
// t on data-parallel rank r corresponds to PipelineCall::data_index = t * micro_batches + k with the same r, so
// the same sampler gives the same global batch.
//
// Activations cross the stage boundaries in PipelineOptions::activation_dtype, output_numel elements of the
// boundary's last layer per micro-batch, on the engine's device (device memory on cuda, through the nccl
// communicator on the caller's stream). A received activation stays allocated until its micro-batch's backward on
// that stage (PipelineCall::input is the same memory in both), so the schedule's in-flight micro-batches (1F1B: at
// most as many as the stages after this one, plus one) bound the boundary memory; what the stage keeps inside its
// layers is the program's.
//
// Errors: the constructor names what does not fit (a stage count that does not divide the ranks, more stages than
// layers, a partition regex that matches no layer, fewer micro-batches than the schedule needs, a layer without an
// output size at a stage boundary) as ConfigError or InvalidArgument, before any communication of the stages. A
// stage that dies or stalls ends every rank's train_batch() with a CommError or TimeoutError naming the transfer
// (activation or gradient, micro-batch, stage and peer rank) within the communicator's timeout, never a hang. After
// such an error the pipeline engine is failed, as an Engine is: resume from a checkpoint in a new one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/pipeline_schedule.hpp"

namespace zero3 {

// One layer of the sequential model, in forward order (DeepSpeed's PipelineModule layers).
struct PipelineLayer {
  std::string name;          // "embedding", "layers.3", "head": what pipeline.partition "type:REGEX" matches
  int64_t parameters = 0;    // elements: what pipeline.partition "parameters" balances
  int64_t output_numel = 0;  // elements of the activation it outputs per micro-batch (needed where a stage ends)
};

// A (virtual) stage: pipeline.stages x zero3.pipeline_virtual_stages of them cut the layers.
struct PipelineStageInfo {
  int stage = 0;
  int stages = 1;
  size_t first_layer = 0;  // the stage holds layers [first_layer, end_layer)
  size_t end_layer = 0;
  int64_t input_numel = 0;   // elements of the activation it receives per micro-batch (0 on the first stage)
  int64_t output_numel = 0;  // elements it sends on (0 on the last stage)
  // pipeline.activation_checkpoint_interval: checkpoint every this many of the stage's layers (0: none). The
  // program's forward and backward apply it (recompute in backward), as DeepSpeed's PipelineModule does inside
  // the layers it runs; the pipeline engine only passes it on.
  int64_t activation_checkpoint_interval = 0;
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == stages - 1; }
};

// What one forward or backward call of a stage works on.
struct PipelineCall {
  const PipelineStageInfo* stage = nullptr;
  int64_t micro_batch = 0;  // 0 .. micro_batches - 1 within this optimizer step
  int64_t data_index = 0;   // optimizer steps so far x micro_batches + micro_batch: which micro-batch of data
  bool training = true;     // false in eval_batch(): no backward follows this forward (keep nothing for it)
  TensorView input;         // the activation from the previous stage (not on the first stage); kept until backward
  TensorView output;        // forward: write the stage's output here (not on the last stage)
  TensorView grad_output;   // backward: d loss / d output (not on the last stage)
  TensorView grad_input;    // backward: write d loss / d input here (not on the first stage)
};

// The program's stages. Called from the thread that calls the pipeline engine.
class PipelineModel {
 public:
  virtual ~PipelineModel() = default;
  // Declares the units of `stage`'s layers on `engine` (not materialized yet); once for each stage this rank
  // holds, in stage order.
  virtual void declare(Engine& engine, const PipelineStageInfo& stage) = 0;
  // The stage's forward on one micro-batch. On the last stage, returns the micro-batch's loss (the value its
  // backward differentiates, before loss scaling); the return value of other stages is ignored.
  virtual double forward(Engine& engine, const PipelineCall& call) = 0;
  // The stage's backward on the same micro-batch (its forward ran on this rank before).
  virtual void backward(Engine& engine, const PipelineCall& call) = 0;
};

struct PipelineOptions {
  DType activation_dtype = DType::f32;  // of the activations and gradients sent between stages
};

// The outcome of one train_batch().
struct PipelineStepResult {
  StepResult step;  // the optimizer step: the same on every rank (norm, clipping and skip over all stages)
  double loss = 0;  // the mean of the global batch's micro-batch losses (the last stage's, on every rank)
};

class PipelineEngine {
 public:
  // Collective over `world`. `config` must have been resolved for world->size() (pipeline.stages, the schedule
  // keys and the batch arithmetic are checked there). Cuts `layers` into stages, splits the world into the stages'
  // data-parallel groups and the pipeline groups (pipeline_topology: zero3.pipeline_stage_order), makes this
  // rank's stage Engine over its data-parallel group, lets `model` declare each stage it holds, and materializes.
  // `model` and `device` must outlive the pipeline engine.
  PipelineEngine(const Config& config, std::shared_ptr<Communicator> world, Device& device,
                 std::vector<PipelineLayer> layers, PipelineModel& model, const PipelineOptions& options = {});
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // Collective: one optimizer step. Runs this rank's actions of the schedule over gradient_accumulation_steps
  // micro-batches (forwards, backwards and the transfers between stages), then the stage engine's step() with the
  // gradient statistics agreed over all stages, then shares the loss from the last stage.
  PipelineStepResult train_batch();

  // Collective: the mean loss of one global batch without gradients (forward only, every stage's scopes in the
  // stage engine's evaluation mode), the last stage's loss on every rank. Its data indices continue a counter of
  // its own, starting at 0.
  double eval_batch();

  // This rank's stage engine (its units: the layers of its stages). For queries, checkpoints and evaluation
  // scopes; not for step().
  Engine& engine();
  const Engine& engine() const;
  // The stages this rank holds (one, or zero3.pipeline_virtual_stages interleaved), in stage order.
  const std::vector<PipelineStageInfo>& stages() const;
  // Every stage's layers: bounds[s] .. bounds[s + 1] (partition_layers()).
  const std::vector<int>& stage_bounds() const;
  const std::vector<PipelineLayer>& layers() const;
  const pipeline::Schedule& schedule() const;
  int pipeline_rank() const;        // this rank's position in its pipeline group
  int pipeline_size() const;        // pipeline.stages
  int data_parallel_rank() const;   // the stage engine's rank
  int data_parallel_size() const;   // world / pipeline.stages
  int world_rank() const;
  // The communicator over every rank of the pipeline (what the constructor was given): for collectives of the
  // whole pipeline between train_batch() calls (checkpoints: zero3/pipeline_checkpoint.hpp), not inside them.
  Communicator& world() const;
  int64_t micro_batches() const;    // gradient_accumulation_steps
  int64_t global_steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero3

#include "pipeline_model.hpp"

#include <algorithm>
#include <string>

#include "ops/cross_entropy.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace llama3 {
using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

std::vector<zero3::PipelineLayer> pipeline_layers(const ModelConfig& config, const BatchShape& shape) {
  std::vector<zero3::PipelineLayer> layers;
  for (const UnitLayout& u : model_unit_layouts(config))
    layers.push_back({u.name, u.numel, shape.tokens() * config.hidden_size});
  return layers;
}

void check_pipeline_model(const ModelConfig& config, int pipeline_ranks) {
  if (config.tie_word_embeddings && pipeline_ranks > 1) {
    throw zero3::ConfigError(
        "pipeline.stages: tie_word_embeddings with pipeline stages > 1 (" + std::to_string(pipeline_ranks) +
        "): the tied LM head is the embedding's weight, and the embedding (first stage) and the head (last stage) "
        "would be units of different stage engines; untie the model or train it without pipeline stages");
  }
}

PipelineStageModel::PipelineStageModel(const ModelConfig& config, const BatchShape& shape, MicroBatchSource& data,
                                       int64_t micro_batches, int data_parallel_size, int pipeline_ranks,
                                       zero3::Device& device, zero3::DType compute,
                                       std::optional<zero3::DType> boundary, const EngineModelOptions& options)
    : config_(config),
      shape_(shape),
      data_(data),
      micro_batches_(micro_batches),
      data_parallel_size_(data_parallel_size),
      checkpointing_(options.activation_checkpointing),
      time_phases_(options.time_phases),
      options_(options),
      layouts_(model_unit_layouts(config)),
      units_(layouts_.size()),
      declared_(layouts_.size(), false) {
  check_pipeline_model(config, pipeline_ranks);
  if (shape.batch <= 0 || shape.seq <= 0 || micro_batches < 1 || data_parallel_size < 1) {
    throw zero3::InvalidArgument("PipelineStageModel: batch " + std::to_string(shape.batch) + ", seq " +
                                 std::to_string(shape.seq) + ", " + std::to_string(micro_batches) +
                                 " micro-batches and " + std::to_string(data_parallel_size) +
                                 " data-parallel ranks must all be > 0");
  }
  ops_ = make_model_ops(device, compute);
  boundary_ = boundary.value_or(ops_->act());
  if (boundary_ != ops_->act()) {
    conversion_ =
        ops_->allocate(static_cast<size_t>(shape.tokens() * config.hidden_size) * zero3::dtype_size(ops_->act()));
  }
  staging_ = std::make_unique<ModelRunner>(config_, *ops_);
  ids_.resize(static_cast<size_t>(shape.tokens()));
  targets_.resize(ids_.size());
}

PipelineStageModel::~PipelineStageModel() {
  if (conversion_ != nullptr) {
    ops_->free(conversion_,
               static_cast<size_t>(shape_.tokens() * config_.hidden_size) * zero3::dtype_size(ops_->act()));
  }
}

int64_t PipelineStageModel::activation_bytes() const {
  int64_t bytes = staging_->peak_allocated_bytes();
  for (const auto& [key, r] : in_flight_) bytes += r->peak_allocated_bytes();
  for (const auto& r : idle_) bytes += r->peak_allocated_bytes();
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------
// Declaration

void PipelineStageModel::declare(zero3::Engine& engine, const zero3::PipelineStageInfo& stage) {
  if (engine.compute_dtype() != ops_->act() && engine.device().type() == zero3::DeviceType::cuda) {
    throw zero3::InvalidArgument("PipelineStageModel::declare: the stage engine computes in " +
                                 std::string(zero3::dtype_name(engine.compute_dtype())) + ", the model's backend in " +
                                 std::string(zero3::dtype_name(ops_->act())));
  }
  check_gradient_dtype(engine);
  // pipeline.activation_checkpoint_interval: the runner recomputes every layer (1) or none; 0 leaves it to the
  // program's option (llama3_train's --grad-checkpointing).
  if (stage.activation_checkpoint_interval > 1) {
    throw zero3::ConfigError(
        "pipeline.activation_checkpoint_interval: " + std::to_string(stage.activation_checkpoint_interval) +
        ": the Llama-3 model checkpoints every layer (1) or follows its own option (0: "
        "--grad-checkpointing), not every " +
        std::to_string(stage.activation_checkpoint_interval) + " layers");
  }
  if (stage.activation_checkpoint_interval == 1) checkpointing_ = true;
  if (stage.end_layer > layouts_.size() || stage.first_layer >= stage.end_layer) {
    throw zero3::InvalidArgument("PipelineStageModel::declare: stage " + std::to_string(stage.stage) +
                                 " holds layers [" + std::to_string(stage.first_layer) + ", " +
                                 std::to_string(stage.end_layer) + "), the model has " +
                                 std::to_string(layouts_.size()));
  }
  // The weights file is opened and checked once, at the first stage this rank declares (every rank checks it
  // whole, so a bad file fails on every rank before the collective materialize()).
  if (!weights_opened_) {
    weights_ = open_init_weights(config_, options_);
    weights_opened_ = true;
  }
  for (size_t i = stage.first_layer; i < stage.end_layer; ++i) {
    units_[i] = declare_unit(engine, layouts_[i], weights_);
    declared_[i] = true;
  }
}

zero3::UnitId PipelineStageModel::unit(size_t layer, const char* what) const {
  if (layer >= declared_.size() || !declared_[layer]) {
    throw zero3::InvalidArgument(std::string("PipelineStageModel::") + what + ": layer " + std::to_string(layer) +
                                 " is not declared on this rank's stage engine");
  }
  return units_[layer];
}

// ---------------------------------------------------------------------------------------------------------
// Micro-batches in flight

std::unique_ptr<ModelRunner> PipelineStageModel::take_runner(const zero3::PipelineStageInfo& stage) {
  std::unique_ptr<ModelRunner> runner;
  if (idle_.empty()) {
    runner = std::make_unique<ModelRunner>(config_, *ops_);
  } else {
    runner = std::move(idle_.back());
    idle_.pop_back();
  }
  // The stage's transformer layers (pipeline layers 1 .. L): the runner keeps their inputs and the stage's output.
  const int64_t L = config_.num_hidden_layers;
  const auto a = static_cast<int64_t>(stage.first_layer), b = static_cast<int64_t>(stage.end_layer);
  runner->set_layer_range(std::max<int64_t>(a, 1) - 1, std::min(b, L + 1) - 1);
  return runner;
}

ModelRunner& PipelineStageModel::start_micro_batch(const zero3::PipelineCall& call) {
  const RunnerKey key{call.stage->stage, call.micro_batch};
  if (in_flight_.count(key)) {
    throw zero3::InvalidArgument("PipelineStageModel::forward: micro-batch " + std::to_string(call.micro_batch) +
                                 " of stage " + std::to_string(call.stage->stage) +
                                 " is already in flight (its backward has not run)");
  }
  std::unique_ptr<ModelRunner> runner = take_runner(*call.stage);
  ModelRunner& r = *runner;
  in_flight_.emplace(key, std::move(runner));
  peak_in_flight_ = std::max(peak_in_flight_, static_cast<int64_t>(in_flight_.size()));
  return r;
}

ModelRunner& PipelineStageModel::running(const zero3::PipelineCall& call, const char* what) {
  auto it = in_flight_.find({call.stage->stage, call.micro_batch});
  if (it == in_flight_.end()) {
    throw zero3::InvalidArgument(std::string("PipelineStageModel::") + what + ": micro-batch " +
                                 std::to_string(call.micro_batch) + " of stage " + std::to_string(call.stage->stage) +
                                 " has no forward on this rank");
  }
  return *it->second;
}

void PipelineStageModel::finish_micro_batch(const zero3::PipelineCall& call) {
  auto it = in_flight_.find({call.stage->stage, call.micro_batch});
  idle_.push_back(std::move(it->second));
  in_flight_.erase(it);
}

void PipelineStageModel::check_boundary(const zero3::TensorView& view, const char* what,
                                        const zero3::PipelineCall& call) const {
  const int64_t numel = shape_.tokens() * config_.hidden_size;
  if (view.data == nullptr || view.numel != numel || view.dtype != boundary_) {
    throw zero3::InvalidArgument(std::string("PipelineStageModel: stage ") + std::to_string(call.stage->stage) +
                                 ", micro-batch " + std::to_string(call.micro_batch) + ": the " + what + " holds " +
                                 std::to_string(view.numel) + " " + std::string(zero3::dtype_name(view.dtype)) +
                                 " elements" + (view.data == nullptr ? " (no buffer)" : "") + ", expected " +
                                 std::to_string(numel) + " " + std::string(zero3::dtype_name(boundary_)) +
                                 " (micro-batch x seq x hidden)");
  }
}

const void* PipelineStageModel::from_boundary(const zero3::TensorView& view) {
  if (conversion_ == nullptr) return view.data;
  ops_->convert(view.data, boundary_, conversion_, ops_->act(), view.numel);
  return conversion_;
}

void PipelineStageModel::store_output(ModelRunner& runner, int64_t layer, const zero3::TensorView& view) {
  runner.store_layer_input(layer, conversion_ != nullptr ? conversion_ : view.data);
  if (conversion_ != nullptr) ops_->convert(conversion_, ops_->act(), view.data, boundary_, view.numel);
}

void PipelineStageModel::store_input_grad(ModelRunner& runner, const zero3::TensorView& view) {
  runner.store_grad(conversion_ != nullptr ? conversion_ : view.data);
  if (conversion_ != nullptr) ops_->convert(conversion_, ops_->act(), view.data, boundary_, view.numel);
}

// The normalizer of every micro-batch of optimizer step `step` (step_loss_normalizer's): the non-ignored targets of
// all data-parallel ranks' micro-batches of the step, over ranks x micro-batches.
double PipelineStageModel::step_normalizer(int64_t step) {
  if (step == normalizer_step_) return normalizer_;
  std::vector<int32_t> ids(ids_.size()), targets(targets_.size());
  int64_t count = 0;
  for (int r = 0; r < data_parallel_size_; ++r) {
    for (int64_t k = 0; k < micro_batches_; ++k) {
      data_.fill(step * micro_batches_ + k, r, ids.data(), targets.data());
      count += count_targets(targets.data(), static_cast<int64_t>(targets.size()), config_.vocab_size);
    }
  }
  normalizer_step_ = step;
  normalizer_ = static_cast<double>(count) / (static_cast<double>(data_parallel_size_) * micro_batches_);
  return normalizer_;
}

// ---------------------------------------------------------------------------------------------------------
// Forward and backward of one stage

// The stage's input (the embedding's forward scope on the first stage, the received activation elsewhere) and its
// transformer layers' forward scopes, after begin_batch.
void PipelineStageModel::forward_layers(zero3::Engine& engine, ModelRunner& runner, const zero3::PipelineCall& call) {
  const size_t a = call.stage->first_layer, b = call.stage->end_layer, L = layouts_.size() - 2;
  if (a == 0) {
    zero3::UnitScope s = engine.forward_scope(unit(0, "forward"));
    runner.embed_forward(scope_params_act(*staging_, s));
    s.close();
  } else {
    check_boundary(call.input, "input activation", call);
    runner.load_layer_input(static_cast<int64_t>(a) - 1, from_boundary(call.input));
  }
  for (size_t i = std::max<size_t>(a, 1); i < std::min(b, L + 1); ++i) {
    zero3::UnitScope s = engine.forward_scope(unit(i, "forward"));
    runner.layer_forward(static_cast<int64_t>(i) - 1, scope_params_act(*staging_, s));
    s.close();
  }
}

double PipelineStageModel::forward(zero3::Engine& engine, const zero3::PipelineCall& call) {
  if (!call.training || engine.evaluating()) return evaluate(engine, call);
  const auto t0 = Clock::now();
  const size_t b = call.stage->end_layer, L = layouts_.size() - 2;
  ModelRunner& runner = start_micro_batch(call);
  // Every stage reads its micro-batch: the first for the ids, the last for the targets, and the runner checks
  // both and sizes its buffers by them.
  data_.fill(call.data_index, engine.rank(), ids_.data(), targets_.data());
  runner.begin_batch(ids_.data(), targets_.data(), shape_, checkpointing_);
  forward_layers(engine, runner, call);
  double loss = 0;
  if (b == L + 2) {
    if (time_phases_) ops_->synchronize();
    times_.forward += seconds_since(t0);
    const auto t1 = Clock::now();
    loss = head(engine, runner, call.data_index);
    if (time_phases_) ops_->synchronize();
    times_.backward += seconds_since(t1);
    return loss;
  }
  check_boundary(call.output, "output activation", call);
  store_output(runner, static_cast<int64_t>(b) - 1, call.output);
  if (time_phases_) ops_->synchronize();
  times_.forward += seconds_since(t0);
  return loss;
}

// The head's backward scope on the last stage (EngineModel::forward_backward's): the loss of the micro-batch and
// the gradient into the head's input, which backward() then takes through the layers.
double PipelineStageModel::head(zero3::Engine& engine, ModelRunner& runner, int64_t data_index) {
  const double normalizer = step_normalizer(data_index / micro_batches_);
  LossOptions lo;
  lo.normalizer = normalizer;
  // fp16: the gradients are those of loss x loss_scale (the engine unscales them); the loss is unscaled.
  const double scale = engine.loss_scale();
  if (scale != 1.0) lo.normalizer = normalizer > 0 ? normalizer / scale : 0.0;
  const size_t head_layer = layouts_.size() - 1;
  zero3::UnitScope s = engine.backward_scope(unit(head_layer, "forward"));
  const void* w = scope_params_act(*staging_, s);
  float* g = scope_grads_f32(*staging_, s);
  LossResult r;
  if (config_.tie_word_embeddings) {
    // One stage engine holds both (check_pipeline_model): the LM head is the embedding's weight, entered a second
    // time inside the head's scope.
    zero3::UnitScope e = engine.backward_scope(unit(0, "forward"));
    r = runner.head_forward_backward(w, g, lo, scope_params_act(*staging_, e, 1), scope_grads_f32(*staging_, e, 1));
    commit_scope_grads(*staging_, e, 1);
    e.close();
  } else {
    r = runner.head_forward_backward(w, g, lo);
  }
  commit_scope_grads(*staging_, s);
  s.close();
  return normalizer > 0 ? r.loss_sum / normalizer : 0.0;
}

void PipelineStageModel::set_evaluation(MicroBatchSource& source, int64_t per_evaluation) {
  if (per_evaluation < 1) {
    throw zero3::InvalidArgument("PipelineStageModel::set_evaluation: " + std::to_string(per_evaluation) +
                                 " micro-batches per evaluation, expected >= 1");
  }
  eval_data_ = &source;
  eval_per_evaluation_ = per_evaluation;
  eval_normalizer_ = -1;
}

// One micro-batch of eval_batch(): forward scopes, and on the last stage the loss over the evaluation's normalizer.
double PipelineStageModel::evaluate(zero3::Engine& engine, const zero3::PipelineCall& call) {
  if (eval_data_ == nullptr) {
    throw zero3::InvalidArgument("PipelineStageModel: an evaluation forward with no evaluation data (set_evaluation)");
  }
  const size_t b = call.stage->end_layer, L = layouts_.size() - 2;
  const bool last = b == L + 2;
  if (last && eval_normalizer_ < 0) {
    int64_t count = 0;
    for (int r = 0; r < data_parallel_size_; ++r) {
      for (int64_t d = 0; d < eval_per_evaluation_; ++d) {
        eval_data_->fill(d, r, ids_.data(), targets_.data());
        count += count_targets(targets_.data(), static_cast<int64_t>(targets_.size()), config_.vocab_size);
      }
    }
    eval_normalizer_ = static_cast<double>(count) / (static_cast<double>(data_parallel_size_) * eval_per_evaluation_);
  }
  std::unique_ptr<ModelRunner> runner = take_runner(*call.stage);
  eval_data_->fill(call.data_index, engine.rank(), ids_.data(), targets_.data());
  runner->begin_batch(ids_.data(), targets_.data(), shape_, true);  // one layer cache: nothing kept for a backward
  forward_layers(engine, *runner, call);
  double loss = 0;
  if (last) {
    LossOptions lo;
    lo.normalizer = eval_normalizer_;
    zero3::UnitScope s = engine.forward_scope(unit(L + 1, "forward"));
    const void* w = scope_params_act(*staging_, s);
    LossResult r;
    if (config_.tie_word_embeddings) {
      zero3::UnitScope e = engine.forward_scope(unit(0, "forward"));  // the LM head's weight
      r = runner->head_forward_loss(w, lo, scope_params_act(*staging_, e, 1));
      e.close();
    } else {
      r = runner->head_forward_loss(w, lo);
    }
    s.close();
    loss = eval_normalizer_ > 0 ? r.loss_sum / eval_normalizer_ : 0.0;
  } else {
    check_boundary(call.output, "output activation", call);
    store_output(*runner, static_cast<int64_t>(b) - 1, call.output);
  }
  idle_.push_back(std::move(runner));
  return loss;
}

void PipelineStageModel::backward(zero3::Engine& engine, const zero3::PipelineCall& call) {
  const auto t0 = Clock::now();
  const size_t a = call.stage->first_layer, b = call.stage->end_layer, L = layouts_.size() - 2;
  ModelRunner& runner = running(call, "backward");
  if (b != L + 2) {
    check_boundary(call.grad_output, "output gradient", call);
    runner.load_grad(from_boundary(call.grad_output));
  }
  const int64_t first = static_cast<int64_t>(std::max<size_t>(a, 1));
  for (int64_t i = static_cast<int64_t>(std::min(b, L + 1)) - 1; i >= first; --i) {
    zero3::UnitScope s = engine.backward_scope(unit(static_cast<size_t>(i), "backward"));
    const void* w = scope_params_act(*staging_, s);
    runner.layer_backward(i - 1, w, scope_grads_f32(*staging_, s));
    commit_scope_grads(*staging_, s);
    s.close();
  }
  if (a == 0) {
    zero3::UnitScope s = engine.backward_scope(unit(0, "backward"));
    runner.embed_backward(scope_grads_f32(*staging_, s));
    commit_scope_grads(*staging_, s);
    s.close();
  } else {
    check_boundary(call.grad_input, "input gradient", call);
    store_input_grad(runner, call.grad_input);
  }
  finish_micro_batch(call);
  if (time_phases_) ops_->synchronize();
  times_.backward += seconds_since(t0);
}

}  // namespace llama3

#include "engine_model.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "backend/lm_head_plan.hpp"
#include "hf_weights.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace llama3 {
namespace st = zero3::safetensors;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

zero3::ParamInit engine_init(const ParamSpec& p) {
  return p.init == ParamInit::ones ? zero3::ParamInit::ones() : zero3::ParamInit::normal(p.init_std);
}

// Tensors of the weights that no parameter takes: Hugging Face's from_pretrained warns about them by name, as
// this does; `strict` makes them an error, like PyTorch's load_state_dict(strict=True).
void warn_about_unknown_tensors(const st::ShardedSafetensorsReader& weights, const std::vector<UnitLayout>& layouts,
                                const ModelConfig& config, bool strict) {
  std::set<std::string> params;
  for (const UnitLayout& u : layouts)
    for (const ParamSpec& p : u.params) params.insert(p.name);
  std::vector<std::string> unknown;
  for (const std::string& name : weights.names()) {
    // A tied model's head is the embedding: an lm_head.weight in the file is known, and not read (said above).
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    if (!params.count(name)) unknown.push_back(name);
  }
  if (unknown.empty()) return;
  std::string list;
  for (size_t i = 0; i < unknown.size() && i < 20; ++i) list += (i ? ", '" : "'") + unknown[i] + "'";
  if (unknown.size() > 20) list += " and " + std::to_string(unknown.size() - 20) + " more";
  const std::string text = weights.source().string() + " holds " + std::to_string(unknown.size()) +
                           " tensor(s) that are not parameters of the model (" + describe(config) + "): " + list;
  if (strict) throw zero3::IoError(text + " (--init-from-strict)");
  zero3::log::warn_rank0(text, "; they are not loaded (--init-from-strict makes this an error)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Declaration

void check_gradient_dtype(zero3::Engine& engine) {
  if (engine.device().type() == zero3::DeviceType::cuda && engine.grad_dtype() == zero3::DType::f16) {
    throw zero3::Unsupported("the Llama-3 model on " + engine.device().name() +
                             " does not support data_types.grad_accum_dtype fp16 (the CUDA kernels convert f32 "
                             "gradients to bf16 only; use fp32 or bf16)");
  }
}

std::shared_ptr<const st::ShardedSafetensorsReader> open_init_weights(const ModelConfig& config,
                                                                      const EngineModelOptions& options) {
  if (options.init_from.empty()) return nullptr;
  const std::vector<UnitLayout> layouts = model_unit_layouts(config);
  auto weights = std::make_shared<const st::ShardedSafetensorsReader>(options.init_from);
  // Every tensor is checked before anything is declared, so a wrong file fails on every rank at once,
  // before the collective materialize().
  for (const UnitLayout& u : layouts) {
    for (const ParamSpec& p : u.params) {
      const st::TensorInfo* info = weights->find(p.name);
      if (info == nullptr) throw missing_tensor_error(weights->source().string(), p, u.name);
      if (info->shape != p.shape) {
        throw zero3::IoError(weights->source().string() + ": tensor '" + p.name + "' has shape " +
                             st::shape_string(info->shape) + ", the model (" + describe(config) + ") expects " +
                             st::shape_string(p.shape));
      }
    }
  }
  if (config.tie_word_embeddings && weights->find("lm_head.weight") != nullptr) {
    zero3::log::info_rank0(weights->source().string(),
                           ": lm_head.weight is not read: the embeddings are tied (tie_word_embeddings), so the "
                           "LM head is model.embed_tokens.weight, as in transformers");
  }
  warn_about_unknown_tensors(*weights, layouts, config, options.init_from_strict);
  return weights;
}

zero3::UnitId declare_unit(zero3::Engine& engine, const UnitLayout& layout,
                           const std::shared_ptr<const st::ShardedSafetensorsReader>& weights) {
  std::vector<zero3::ParamSpec> specs;
  for (const ParamSpec& p : layout.params) {
    zero3::ParamInit init =
        weights ? zero3::ParamInit::from_reader(st::make_f32_reader(weights, p.name, p.numel)) : engine_init(p);
    specs.emplace_back(p.name, p.shape, std::move(init));
  }
  return engine.add_unit(layout.name, specs);
}

EngineModel::EngineModel(zero3::Engine& engine, const ModelConfig& config, const EngineModelOptions& options)
    : engine_(engine),
      config_(config),
      layouts_(model_unit_layouts(config)),
      time_phases_(options.time_phases),
      checkpointing_(options.activation_checkpointing) {
  // The backend first: a device or dtype it lacks fails before anything is declared.
  ops_ = make_model_ops(engine_.device(), engine_.compute_dtype());
  check_gradient_dtype(engine_);
  const std::shared_ptr<const st::ShardedSafetensorsReader> weights = open_init_weights(config_, options);
  for (const UnitLayout& u : layouts_) units_.push_back(declare_unit(engine_, u, weights));
  runner_ = std::make_unique<ModelRunner>(config_, *ops_);
}

// ---------------------------------------------------------------------------------------------------------
// Scopes and dtype staging

const void* scope_params_act(ModelRunner& staging, const zero3::UnitScope& scope, int slot) {
  const zero3::TensorView v = scope.flat_params();
  ModelOps& ops = staging.ops();
  if (v.dtype == ops.act()) return v.data;
  void* buf = staging.param_staging(v.numel, slot);
  ops.convert(v.data, v.dtype, buf, ops.act(), v.numel);
  return buf;
}

float* scope_grads_f32(ModelRunner& staging, const zero3::UnitScope& scope, int slot) {
  const zero3::TensorView g = scope.flat_grads();
  if (g.dtype == zero3::DType::f32) return g.as<float>();  // zeroed by the engine when the scope opened
  float* buf = staging.grad_staging(g.numel, slot);
  staging.ops().zero(buf, static_cast<size_t>(g.numel) * sizeof(float));
  return buf;
}

void commit_scope_grads(ModelRunner& staging, const zero3::UnitScope& scope, int slot) {
  const zero3::TensorView g = scope.flat_grads();
  if (g.dtype == zero3::DType::f32) return;
  staging.ops().convert(staging.grad_staging(g.numel, slot), zero3::DType::f32, g.data, g.dtype, g.numel);
}

const void* EngineModel::params_act(const zero3::UnitScope& scope, int slot) {
  return scope_params_act(*runner_, scope, slot);
}

float* EngineModel::grads_f32(const zero3::UnitScope& scope, int slot) {
  return scope_grads_f32(*runner_, scope, slot);
}

void EngineModel::commit_grads(const zero3::UnitScope& scope, int slot) { commit_scope_grads(*runner_, scope, slot); }

// ---------------------------------------------------------------------------------------------------------
// One micro-batch

void EngineModel::check_shape(const BatchShape& shape, const char* what) const {
  if (shape.batch <= 0 || shape.seq <= 0) {
    throw zero3::InvalidArgument(std::string(what) + ": batch " + std::to_string(shape.batch) + " and seq " +
                                 std::to_string(shape.seq) + " must both be > 0");
  }
  if (shape.seq > config_.max_position_embeddings) {
    zero3::log::warn_rank0("sequence length ", shape.seq, " exceeds the model's max_position_embeddings ",
                           config_.max_position_embeddings);
  }
}

LossResult EngineModel::forward_backward(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                                         const LossOptions& loss) {
  check_shape(shape, "EngineModel::forward_backward");
  const int64_t L = config_.num_hidden_layers, n = shape.tokens();
  runner_->begin_batch(ids, targets, shape, checkpointing_);

  // Forward: embedding and layers.
  auto t0 = Clock::now();
  {
    zero3::UnitScope s = engine_.forward_scope(units_.front());
    runner_->embed_forward(params_act(s));
    s.close();
  }
  for (int64_t i = 0; i < L; ++i) {
    zero3::UnitScope s = engine_.forward_scope(units_[static_cast<size_t>(1 + i)]);
    runner_->layer_forward(i, params_act(s));
    s.close();
  }
  if (time_phases_) ops_->synchronize();
  times_.forward += seconds_since(t0);

  // Backward: head (forward, loss and backward in one pass), layers in reverse, embedding.
  t0 = Clock::now();
  // fp16: the gradients are those of loss x loss_scale (the engine unscales them); the result is unscaled.
  const double scale = engine_.loss_scale();
  LossOptions scaled = loss;
  double normalizer = loss.normalizer;
  if (scale != 1.0) {
    if (normalizer <= 0) normalizer = static_cast<double>(count_targets(targets, n, config_.vocab_size));
    scaled.normalizer = normalizer > 0 ? normalizer / scale : 0.0;
  }
  LossResult result;
  {
    zero3::UnitScope s = engine_.backward_scope(units_.back());
    const void* w = params_act(s);
    float* g = grads_f32(s);
    if (config_.tie_word_embeddings) {
      // The LM head is the embedding's weight: its unit is entered a second time, inside the head's scope; the
      // engine adds this scope's gradient to the embedding backward's.
      zero3::UnitScope e = engine_.backward_scope(units_.front());
      result = runner_->head_forward_backward(w, g, scaled, params_act(e, 1), grads_f32(e, 1));
      commit_grads(e, 1);
      e.close();
    } else {
      result = runner_->head_forward_backward(w, g, scaled);
    }
    if (scale != 1.0) {
      result.normalizer = normalizer;
      if (!loss.defer_loss_sum) result.loss = normalizer > 0 ? result.loss_sum / normalizer : 0.0;
    }
    commit_grads(s);
    s.close();
  }
  for (int64_t i = L - 1; i >= 0; --i) {
    zero3::UnitScope s = engine_.backward_scope(units_[static_cast<size_t>(1 + i)]);
    const void* w = params_act(s);
    runner_->layer_backward(i, w, grads_f32(s));
    commit_grads(s);
    s.close();
  }
  {
    zero3::UnitScope s = engine_.backward_scope(units_.front());
    runner_->embed_backward(grads_f32(s));
    commit_grads(s);
    s.close();
  }
  if (time_phases_) ops_->synchronize();
  times_.backward += seconds_since(t0);
  ++times_.micro_batches;
  return result;
}

LossResult EngineModel::evaluate(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                                 const LossOptions& loss) {
  if (!engine_.evaluating()) {
    throw zero3::InvalidArgument("EngineModel::evaluate: the engine is not evaluating (open Engine::evaluate() first)");
  }
  check_shape(shape, "EngineModel::evaluate");
  // One layer cache whatever checkpointing says: nothing is kept for a backward.
  runner_->begin_batch(ids, targets, shape, true);
  {
    zero3::UnitScope s = engine_.forward_scope(units_.front());
    runner_->embed_forward(params_act(s));
    s.close();
  }
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    zero3::UnitScope s = engine_.forward_scope(units_[static_cast<size_t>(1 + i)]);
    runner_->layer_forward(i, params_act(s));
    s.close();
  }
  zero3::UnitScope s = engine_.forward_scope(units_.back());
  const void* w = params_act(s);
  LossResult result;
  if (config_.tie_word_embeddings) {
    zero3::UnitScope e = engine_.forward_scope(units_.front());  // the LM head's weight
    result = runner_->head_forward_loss(w, loss, params_act(e, 1));
    e.close();
  } else {
    result = runner_->head_forward_loss(w, loss);
  }
  s.close();
  return result;
}

// ---------------------------------------------------------------------------------------------------------
// Whole parameters

void EngineModel::gather_unit(size_t index, float* out) { engine_.gather_master_params(units_.at(index), out); }

uint64_t EngineModel::save_hf(const std::filesystem::path& dir, st::Dtype dtype, uint64_t max_shard_bytes,
                              const std::string& config_json) {
  if (dtype != st::Dtype::f32 && dtype != st::Dtype::bf16) {
    throw zero3::InvalidArgument("save_hf: dtype " + std::string(st::dtype_name(dtype)) + ", expected F32 or BF16");
  }
  // Checked on every rank, before the first collective (only rank 0 makes the writer).
  if (max_shard_bytes == 0) throw zero3::InvalidArgument("save_hf: max_shard_bytes is 0, expected > 0");
  const bool writer_rank = engine_.rank() == 0;
  std::vector<st::TensorDecl> decls;
  for (const UnitLayout& u : layouts_)
    for (const ParamSpec& p : u.params) decls.push_back({p.name, dtype, p.shape});
  std::unique_ptr<st::ShardedSafetensorsWriter> writer;
  if (writer_rank) {
    std::filesystem::create_directories(dir);
    writer = std::make_unique<st::ShardedSafetensorsWriter>(dir, decls, max_shard_bytes);
  }
  std::vector<float> buf;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    buf.resize(static_cast<size_t>(layouts_[u].numel));
    gather_unit(u, buf.data());  // collective: every rank takes part, rank 0 keeps the unit
    if (!writer_rank) continue;
    for (const ParamSpec& p : layouts_[u].params) writer->write_from_f32(p.name, buf.data() + p.offset, p.numel);
  }
  if (!writer_rank) return 0;
  writer->finish();
  uint64_t bytes = 0;
  for (const st::TensorDecl& d : decls) bytes += st::tensor_bytes(d);
  if (!config_json.empty()) write_exported_config(dir, config_json, dtype == st::Dtype::bf16 ? "bfloat16" : "float32");
  return bytes;
}

double step_loss_normalizer(zero3::Engine& engine, int64_t local_targets, int64_t micro_batches) {
  if (local_targets < 0 || micro_batches < 1) {
    throw zero3::InvalidArgument("step_loss_normalizer: " + std::to_string(local_targets) + " targets over " +
                                 std::to_string(micro_batches) + " micro-batches");
  }
  // Two 16-bit halves as floats: each sum stays exact in fp32 (below 2^24) for up to 256 ranks.
  const int world = engine.world_size();
  if (local_targets >= (int64_t{1} << 32) || world > 256) {
    throw zero3::InvalidArgument("step_loss_normalizer: " + std::to_string(local_targets) + " targets on " +
                                 std::to_string(world) + " ranks is beyond the exact float count");
  }
  float parts[2] = {static_cast<float>(local_targets >> 16), static_cast<float>(local_targets & 0xffff)};
  engine.all_reduce_host(parts, 2);
  const double total = static_cast<double>(parts[0]) * 65536.0 + static_cast<double>(parts[1]);
  return total / (static_cast<double>(world) * static_cast<double>(micro_batches));
}

// ---------------------------------------------------------------------------------------------------------
// Plans

zero3::ModelDesc engine_model_desc(const ModelConfig& config, const std::string& name) {
  zero3::ModelDesc m;
  m.name = name;
  for (const UnitLayout& u : model_unit_layouts(config)) {
    zero3::UnitDesc d;
    d.name = u.name;
    for (const ParamSpec& p : u.params) d.params.push_back(p.shape);
    m.units.push_back(std::move(d));
  }
  return m;
}

ActivationEstimate estimate_activations(const ModelConfig& c, const BatchShape& s, bool checkpointing,
                                        zero3::DeviceType device, zero3::DType compute, zero3::DType grads) {
  zero3::ActivationOptions o;
  o.micro_batch = s.batch;
  o.seq_len = s.seq;
  o.checkpointing = checkpointing;
  o.on_gpu = device == zero3::DeviceType::cuda;
  o.compute = compute;
  o.grad_accum = grads;
  return zero3::estimate_activations(llama_dims(c), o);
}

}  // namespace llama3

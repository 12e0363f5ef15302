#include "engine_model.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "ops/parallel.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace llama3 {
namespace st = zero3::safetensors;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <typename T>
int64_t capacity_bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

template <typename T>
void ensure(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

int64_t cache_bytes(const LayerCache<float>& c) {
  return capacity_bytes(c.rstd1) + capacity_bytes(c.qkv) + capacity_bytes(c.lse) + capacity_bytes(c.attn) +
         capacity_bytes(c.h) + capacity_bytes(c.rstd2) + capacity_bytes(c.gu);
}

int64_t workspace_bytes(const LayerWorkspace<float>& w) {
  return capacity_bytes(w.xn) + capacity_bytes(w.act) + capacity_bytes(w.y) + capacity_bytes(w.dh) +
         capacity_bytes(w.dwide) + capacity_bytes(w.dmid);
}

zero3::ParamInit engine_init(const ParamSpec& p) {
  return p.init == ParamInit::ones ? zero3::ParamInit::ones() : zero3::ParamInit::normal(p.init_std);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Declaration

EngineModel::EngineModel(zero3::Engine& engine, const ModelConfig& config, const EngineModelOptions& options)
    : engine_(engine),
      config_(config),
      layouts_(model_unit_layouts(config)),
      checkpointing_(options.activation_checkpointing) {
  std::shared_ptr<const st::ShardedSafetensorsReader> weights;
  if (!options.init_from.empty()) {
    weights = std::make_shared<const st::ShardedSafetensorsReader>(options.init_from);
    // Every tensor is checked before anything is declared, so a wrong file fails on every rank at once,
    // before the collective materialize().
    for (const UnitLayout& u : layouts_) {
      for (const ParamSpec& p : u.params) {
        const st::TensorInfo* info = weights->find(p.name);
        if (info == nullptr) {
          throw zero3::IoError(weights->source().string() + ": no tensor '" + p.name + "' (parameter of unit " +
                               u.name + ", shape " + st::shape_string(p.shape) + ")");
        }
        if (info->shape != p.shape) {
          throw zero3::IoError(weights->source().string() + ": tensor '" + p.name + "' has shape " +
                               st::shape_string(info->shape) + ", the model (" + describe(config_) + ") expects " +
                               st::shape_string(p.shape));
        }
      }
    }
  }
  for (const UnitLayout& u : layouts_) {
    std::vector<zero3::ParamSpec> specs;
    for (const ParamSpec& p : u.params) {
      zero3::ParamInit init =
          weights ? zero3::ParamInit::from_reader(st::make_f32_reader(weights, p.name, p.numel)) : engine_init(p);
      specs.emplace_back(p.name, p.shape, std::move(init));
    }
    units_.push_back(engine_.add_unit(u.name, specs));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Scopes and dtype staging

const float* EngineModel::params_f32(const zero3::UnitScope& scope, std::vector<float>& staging) const {
  const zero3::TensorView v = scope.flat_params();
  if (v.dtype == zero3::DType::f32) return v.as<float>();
  ensure(staging, v.numel);
  const uint16_t* src = v.as<uint16_t>();
  float* dst = staging.data();
  const int64_t n = v.numel;
  if (v.dtype == zero3::DType::bf16) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) dst[i] = zero3::bf16_to_f32(src[i]);
  } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) dst[i] = zero3::f16_to_f32(src[i]);
  }
  return dst;
}

float* EngineModel::grads_f32(const zero3::UnitScope& scope, std::vector<float>& staging) const {
  const zero3::TensorView g = scope.flat_grads();
  if (g.dtype == zero3::DType::f32) return g.as<float>();  // zeroed by the engine when the scope opened
  ensure(staging, g.numel);
  std::fill(staging.begin(), staging.begin() + g.numel, 0.0f);
  return staging.data();
}

void EngineModel::commit_grads(const zero3::UnitScope& scope, const std::vector<float>& staging) const {
  const zero3::TensorView g = scope.flat_grads();
  if (g.dtype == zero3::DType::f32) return;
  uint16_t* dst = g.as<uint16_t>();
  const float* src = staging.data();
  const int64_t n = g.numel;
  const bool bf16 = g.dtype == zero3::DType::bf16;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16 ? zero3::f32_to_bf16(src[i]) : zero3::f32_to_f16(src[i]);
}

// ---------------------------------------------------------------------------------------------------------
// One micro-batch

LossResult EngineModel::forward_backward(const int32_t* ids, const int32_t* targets, const BatchShape& shape,
                                         const LossOptions& loss) {
  if (shape.batch <= 0 || shape.seq <= 0) {
    throw zero3::InvalidArgument("EngineModel::forward_backward: batch " + std::to_string(shape.batch) + " and seq " +
                                 std::to_string(shape.seq) + " must both be > 0");
  }
  if (shape.seq > config_.max_position_embeddings) {
    zero3::log::warn_rank0("sequence length ", shape.seq, " exceeds the model's max_position_embeddings ",
                           config_.max_position_embeddings);
  }
  const int64_t L = config_.num_hidden_layers, n = shape.tokens(), hid = config_.hidden_size;
  if (!rope_ || rope_shape_.batch != shape.batch || rope_shape_.seq != shape.seq) {
    std::vector<int32_t> pos = default_positions(shape);
    rope_ = std::make_unique<RopeTable<float>>(make_rope_table<float>(rope_inv_freq(config_), pos.data(), n));
    rope_shape_ = shape;
  }
  resid_.resize(static_cast<size_t>(L + 1));
  for (auto& r : resid_) r.resize(static_cast<size_t>(n * hid));
  const size_t n_caches = checkpointing_ ? 1 : static_cast<size_t>(L);
  if (caches_.size() != n_caches) caches_.resize(n_caches);
  dx_.resize(static_cast<size_t>(n * hid));

  // Forward: embedding and layers.
  auto t0 = Clock::now();
  {
    zero3::UnitScope s = engine_.forward_scope(units_.front());
    const float* w = params_f32(s, param_staging_);
    embed_forward(config_, embedding_view(config_, w), ids, n, resid_[0].data());
    s.close();
  }
  for (int64_t i = 0; i < L; ++i) {
    zero3::UnitScope s = engine_.forward_scope(units_[static_cast<size_t>(1 + i)]);
    const float* w = params_f32(s, param_staging_);
    LayerCache<float>& cache = caches_[checkpointing_ ? 0 : static_cast<size_t>(i)];
    layer_forward(config_, layer_view(config_, w), static_cast<const float*>(resid_[i].data()), resid_[i + 1].data(),
                  shape, *rope_, cache, ws_);
    s.close();
  }
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
    const float* w = params_f32(s, param_staging_);
    float* g = grads_f32(s, grad_staging_);
    result = head_forward_backward(config_, head_view(config_, w), static_cast<const float*>(resid_[L].data()), targets,
                                   n, dx_.data(), head_view(config_, g), scaled);
    if (scale != 1.0) {
      result.normalizer = normalizer;
      result.loss = normalizer > 0 ? result.loss_sum / normalizer : 0.0;
    }
    commit_grads(s, grad_staging_);
    s.close();
  }
  for (int64_t i = L - 1; i >= 0; --i) {
    zero3::UnitScope s = engine_.backward_scope(units_[static_cast<size_t>(1 + i)]);
    const float* w = params_f32(s, param_staging_);
    float* g = grads_f32(s, grad_staging_);
    LayerCache<float>& cache = caches_[checkpointing_ ? 0 : static_cast<size_t>(i)];
    layer_backward(config_, layer_view(config_, w), static_cast<const float*>(resid_[i].data()),
                   static_cast<const float*>(dx_.data()), dx_.data(), layer_view(config_, g), shape, *rope_, cache, ws_,
                   checkpointing_);
    commit_grads(s, grad_staging_);
    s.close();
  }
  {
    zero3::UnitScope s = engine_.backward_scope(units_.front());
    float* g = grads_f32(s, grad_staging_);
    embed_backward(config_, ids, n, static_cast<const float*>(dx_.data()), embedding_view(config_, g));
    commit_grads(s, grad_staging_);
    s.close();
  }
  times_.backward += seconds_since(t0);
  ++times_.micro_batches;

  int64_t bytes = capacity_bytes(dx_) + workspace_bytes(ws_) + capacity_bytes(param_staging_) +
                  capacity_bytes(grad_staging_) + capacity_bytes(rope_->cos) + capacity_bytes(rope_->sin);
  for (const auto& r : resid_) bytes += capacity_bytes(r);
  for (const auto& c : caches_) bytes += cache_bytes(c);
  activation_bytes_ = std::max(activation_bytes_, bytes);
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
  if (!config_json.empty()) {
    std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
    out << config_json;
    if (!out.flush()) throw zero3::IoError((dir / "config.json").string() + ": cannot write it");
  }
  return bytes;
}

double step_loss_normalizer(zero3::Communicator& comm, int64_t local_targets, int64_t micro_batches) {
  if (local_targets < 0 || micro_batches < 1) {
    throw zero3::InvalidArgument("step_loss_normalizer: " + std::to_string(local_targets) + " targets over " +
                                 std::to_string(micro_batches) + " micro-batches");
  }
  // Two 16-bit halves as floats: each sum stays exact in fp32 (below 2^24) for up to 256 ranks.
  if (local_targets >= (int64_t{1} << 32) || comm.size() > 256) {
    throw zero3::InvalidArgument("step_loss_normalizer: " + std::to_string(local_targets) + " targets on " +
                                 std::to_string(comm.size()) + " ranks is beyond the exact float count");
  }
  float parts[2] = {static_cast<float>(local_targets >> 16), static_cast<float>(local_targets & 0xffff)};
  comm.all_reduce(parts, 2, zero3::DType::f32, zero3::ReduceOp::sum)->wait();
  const double total = static_cast<double>(parts[0]) * 65536.0 + static_cast<double>(parts[1]);
  return total / (static_cast<double>(comm.size()) * static_cast<double>(micro_batches));
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
                                        int64_t element_bytes, bool widen_units) {
  const int64_t n = s.tokens(), hid = c.hidden_size, L = c.num_hidden_layers;
  ActivationEstimate e;
  e.layer_inputs = (L + 1) * n * hid * element_bytes;
  e.layer_caches = (checkpointing ? 1 : L) * layer_cache_elements(c, s) * element_bytes;
  // The layer workspace, dx, and what the head holds while it runs: normalised states, their gradient, 1/rms.
  e.workspace = (layer_workspace_elements(c, s) + n * hid + 2 * n * hid + n) * element_bytes;
  e.loss_chunk = std::min(n, default_loss_chunk_rows(c.vocab_size)) * c.vocab_size * element_bytes;
  if (widen_units) {
    int64_t largest = 0;
    for (const UnitLayout& u : model_unit_layouts(c)) largest = std::max(largest, u.numel);
    e.unit_staging = largest * 4;
  }
  return e;
}

}  // namespace llama3

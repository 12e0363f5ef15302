#include "model_runner.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "llama_layout.hpp"
#include "ops/embedding.hpp"
#include "ops/rope.hpp"
#include "zero3/error.hpp"

namespace llama3 {
namespace {

int64_t wide_width(const ModelConfig& c) { return std::max(2 * c.intermediate_size, c.qkv_dim()); }
int64_t mid_width(const ModelConfig& c) { return std::max(c.intermediate_size, c.q_dim()); }
int64_t lse_elements(const ModelConfig& c, const BatchShape& s) { return s.batch * c.num_attention_heads * s.seq; }

}  // namespace

RunnerBufferSizes runner_buffer_sizes(const ModelConfig& c, const BatchShape& s, bool checkpointing,
                                      int64_t act_bytes) {
  return zero3::llama_runner_buffers(llama_dims(c), s.batch, s.seq, checkpointing, act_bytes);
}

ModelRunner::ModelRunner(const ModelConfig& config, ModelOps& ops)
    : config_(config), ops_(ops), end_layer_(config.num_hidden_layers) {
  const UnitLayout layer = layer_unit_layout(config_, 0);
  for (int p = 0; p < kLayerParamCount; ++p) offsets_[p] = layer.params[static_cast<size_t>(p)].offset;
  if (!config_.tie_word_embeddings) head_lm_offset_ = head_unit_layout(config_).param("lm_head.weight").offset;
  eps_ = static_cast<float>(config_.rms_norm_eps);
}

ModelRunner::~ModelRunner() {
  for (Buffer* b :
       {&ids_, &targets_, &cos_, &sin_, &resid_, &xn_, &mlp_act_, &y_, &dh_, &dwide_, &dmid_, &dx_, &head_rstd_})
    release(*b);
  for (int i = 0; i < kStagingSlots; ++i) release(param_staging_[i]), release(grad_staging_[i]);
  for (Cache& c : caches_) release(c);
}

// ---------------------------------------------------------------------------------------------------------
// Buffers

void* ModelRunner::ensure(Buffer& b, int64_t elements, size_t element_bytes) {
  const size_t bytes = static_cast<size_t>(elements) * element_bytes;
  if (bytes > b.bytes) {
    release(b);
    b.ptr = ops_.allocate(bytes);
    b.bytes = bytes;
    allocated_ += static_cast<int64_t>(bytes);
    peak_allocated_ = std::max(peak_allocated_, allocated_);
  }
  return b.ptr;
}

void ModelRunner::release(Buffer& b) {
  ops_.free(b.ptr, b.bytes);
  allocated_ -= static_cast<int64_t>(b.bytes);
  b = {};
}

void ModelRunner::release(Cache& c) {
  for (Buffer* b : {&c.rstd1, &c.qkv, &c.lse, &c.attn, &c.h, &c.rstd2, &c.gu}) release(*b);
  c.valid = false;
}

void ModelRunner::size_cache(Cache& c) {
  const int64_t n = shape_.tokens(), E = static_cast<int64_t>(ops_.act_size());
  ensure(c.rstd1, n, 4);
  ensure(c.qkv, n * config_.qkv_dim(), E);
  ensure(c.lse, lse_elements(config_, shape_), 4);
  ensure(c.attn, n * config_.q_dim(), E);
  ensure(c.h, n * config_.hidden_size, E);
  ensure(c.rstd2, n, 4);
  ensure(c.gu, n * 2 * config_.intermediate_size, E);
  c.valid = false;
}

char* ModelRunner::act_at(void* base, int64_t elements) const {
  return static_cast<char*>(base) + elements * static_cast<int64_t>(ops_.act_size());
}

const char* ModelRunner::act_at(const void* base, int64_t elements) const {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(ops_.act_size());
}

void* ModelRunner::layer_input(int64_t i) const {
  return act_at(resid_.ptr, (i - first_layer_) * shape_.tokens() * config_.hidden_size);
}

ModelRunner::Cache& ModelRunner::cache_of(int64_t layer) {
  return caches_[checkpointing_ ? 0 : static_cast<size_t>(layer - first_layer_)];
}

void ModelRunner::check_layer(int64_t layer, const char* what) const {
  if (!batch_ready_) throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": no begin_batch yet");
  if (layer < first_layer_ || layer >= end_layer_) {
    throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": layer " + std::to_string(layer) +
                                 " outside the runner's layers [" + std::to_string(first_layer_) + ", " +
                                 std::to_string(end_layer_) + ")");
  }
}

void ModelRunner::set_layer_range(int64_t first, int64_t end) {
  if (first < 0 || end < first || end > config_.num_hidden_layers) {
    throw zero3::InvalidArgument("ModelRunner::set_layer_range: [" + std::to_string(first) + ", " +
                                 std::to_string(end) + ") is not a range of the model's " +
                                 std::to_string(config_.num_hidden_layers) + " layers");
  }
  first_layer_ = first;
  end_layer_ = end;
  batch_ready_ = false;  // the next begin_batch sizes the buffers for the range
}

namespace {
int check_slot(int slot, const char* what) {
  if (slot < 0 || slot >= ModelRunner::kStagingSlots) {
    throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": slot " + std::to_string(slot) +
                                 " outside [0, " + std::to_string(ModelRunner::kStagingSlots) + ")");
  }
  return slot;
}
}  // namespace

void* ModelRunner::param_staging(int64_t numel, int slot) {
  return ensure(param_staging_[check_slot(slot, "param_staging")], numel, ops_.act_size());
}

float* ModelRunner::grad_staging(int64_t numel, int slot) {
  return static_cast<float*>(ensure(grad_staging_[check_slot(slot, "grad_staging")], numel, sizeof(float)));
}

void ModelRunner::load_layer_input(int64_t i, const void* src) {
  check_boundary(i, "load_layer_input");
  ops_.copy(layer_input(i), src, boundary_bytes());
}

void ModelRunner::store_layer_input(int64_t i, void* dst) {
  check_boundary(i, "store_layer_input");
  ops_.copy(dst, layer_input(i), boundary_bytes());
}

void ModelRunner::load_grad(const void* src) {
  check_boundary(first_layer_, "load_grad");
  ops_.copy(dx_.ptr, src, boundary_bytes());
}

void ModelRunner::store_grad(void* dst) {
  check_boundary(first_layer_, "store_grad");
  ops_.copy(dst, dx_.ptr, boundary_bytes());
}

void ModelRunner::check_boundary(int64_t i, const char* what) const {
  if (!batch_ready_) throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": no begin_batch yet");
  if (i < first_layer_ || i > end_layer_) {
    throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": layer input " + std::to_string(i) +
                                 " outside the runner's [" + std::to_string(first_layer_) + ", " +
                                 std::to_string(end_layer_) + "]");
  }
}

size_t ModelRunner::boundary_bytes() const {
  return static_cast<size_t>(shape_.tokens() * config_.hidden_size) * ops_.act_size();
}

// ---------------------------------------------------------------------------------------------------------
// The batch

void ModelRunner::begin_batch(const int32_t* ids, const int32_t* targets, const BatchShape& shape, bool checkpointing) {
  batch_ready_ = false;
  if (shape.batch <= 0 || shape.seq <= 0) {
    throw zero3::InvalidArgument("ModelRunner::begin_batch: batch " + std::to_string(shape.batch) + " and seq " +
                                 std::to_string(shape.seq) + " must both be > 0");
  }
  const int64_t n = shape.tokens(), hid = config_.hidden_size;
  const int64_t E = static_cast<int64_t>(ops_.act_size());
  check_token_ids(ids, n, config_.vocab_size, "input_ids");
  count_targets(targets, n, config_.vocab_size);  // throws for a target outside the vocabulary
  shape_ = shape;
  checkpointing_ = checkpointing;
  host_ids_.assign(ids, ids + n);
  host_targets_.assign(targets, targets + n);

  ops_.copy_from_host(ensure(ids_, n, sizeof(int32_t)), ids, static_cast<size_t>(n) * sizeof(int32_t));
  ops_.copy_from_host(ensure(targets_, n, sizeof(int32_t)), targets, static_cast<size_t>(n) * sizeof(int32_t));
  if (rope_shape_.batch != shape.batch || rope_shape_.seq != shape.seq) {
    const std::vector<int32_t> pos = default_positions(shape);
    const RopeTable<float> rope = make_rope_table<float>(rope_inv_freq(config_), pos.data(), n);
    const size_t bytes = rope.cos.size() * sizeof(float);
    ops_.copy_from_host(ensure(cos_, static_cast<int64_t>(rope.cos.size()), sizeof(float)), rope.cos.data(), bytes);
    ops_.copy_from_host(ensure(sin_, static_cast<int64_t>(rope.sin.size()), sizeof(float)), rope.sin.data(), bytes);
    rope_shape_ = shape;
  }

  const int64_t layers = end_layer_ - first_layer_;
  ensure(resid_, (layers + 1) * n * hid, E);
  const size_t n_caches = checkpointing ? std::min<size_t>(1, static_cast<size_t>(layers)) : static_cast<size_t>(layers);
  while (caches_.size() > n_caches) {
    release(caches_.back());
    caches_.pop_back();
  }
  caches_.resize(n_caches);
  for (Cache& c : caches_) size_cache(c);
  ensure(xn_, n * hid, E);
  ensure(mlp_act_, n * config_.intermediate_size, E);
  ensure(y_, n * hid, E);
  ensure(dh_, n * hid, E);
  ensure(dwide_, n * wide_width(config_), E);
  ensure(dmid_, n * mid_width(config_), E);
  ensure(dx_, n * hid, E);
  ensure(head_rstd_, n, sizeof(float));
  batch_ready_ = true;
}

// ---------------------------------------------------------------------------------------------------------
// Units (the order of llama_model.cpp, op for op)

void ModelRunner::linear_forward(const void* x, int64_t ldx, const void* w, void* y, int64_t ldy, int64_t in,
                                 int64_t out) {
  ops_.gemm(false, true, shape_.tokens(), out, in, 1.0f, x, ldx, w, in, 0.0f, y, ldy, ops_.act());
}

void ModelRunner::linear_backward(const void* x, int64_t ldx, const void* w, const void* dy, int64_t lddy, void* dx,
                                  int64_t lddx, float* dw, int64_t in, int64_t out, bool accumulate_dx) {
  const int64_t n = shape_.tokens();
  if (dx != nullptr)
    ops_.gemm(false, false, n, in, out, 1.0f, dy, lddy, w, in, accumulate_dx ? 1.0f : 0.0f, dx, lddx, ops_.act());
  if (dw != nullptr) ops_.gemm(true, false, out, in, n, 1.0f, dy, lddy, x, ldx, 1.0f, dw, in, zero3::DType::f32);
}

void ModelRunner::check_ends(bool embedding, const char* what) const {
  if (!batch_ready_) throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": no begin_batch yet");
  if (embedding ? first_layer_ != 0 : end_layer_ != config_.num_hidden_layers) {
    throw zero3::InvalidArgument(std::string("ModelRunner::") + what + ": the runner's layers [" +
                                 std::to_string(first_layer_) + ", " + std::to_string(end_layer_) + ") do not " +
                                 (embedding ? "start at the embedding's output" : "end at the head's input"));
  }
}

void ModelRunner::embed_forward(const void* w) {
  check_ends(true, "embed_forward");
  ops_.embedding_forward(static_cast<const int32_t*>(ids_.ptr), shape_.tokens(), w, config_.vocab_size,
                         config_.hidden_size, layer_input(0));
}

void ModelRunner::embed_backward(float* g) {
  check_ends(true, "embed_backward");
  ops_.embedding_backward(static_cast<const int32_t*>(ids_.ptr), host_ids_.data(), shape_.tokens(), dx_.ptr,
                          config_.vocab_size, config_.hidden_size, g);
}

// y = h + mlp(post_attention_layernorm(h)), h = x + attn(input_layernorm(x)); the cache keeps what backward
// reads. (llama_model.cpp's layer_forward.) y null: the recomputation of a checkpointed layer, which stops once the
// cache, xn_ (the second norm's output) and mlp_act_ (SwiGLU's) hold what backward reads: the down projection and
// the residual add after it produce only the layer's output, which backward never reads.
void ModelRunner::forward_into(const void* w, const void* x, void* y, Cache& cache) {
  const ModelConfig& c = config_;
  const int64_t n = shape_.tokens(), hid = c.hidden_size, inter = c.intermediate_size, qkv_dim = c.qkv_dim();
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const float* cos = static_cast<const float*>(cos_.ptr);
  const float* sin = static_cast<const float*>(sin_.ptr);
  auto W = [&](LayerParam p) { return act_at(w, offsets_[p]); };
  cache.valid = false;
  cache.shape = shape_;
  float* rstd1 = static_cast<float*>(cache.rstd1.ptr);
  float* rstd2 = static_cast<float*>(cache.rstd2.ptr);
  float* lse = static_cast<float*>(cache.lse.ptr);
  void* qkv = cache.qkv.ptr;

  // Attention block.
  ops_.rmsnorm_forward(x, W(kInputLayernorm), xn_.ptr, rstd1, n, hid, eps_);
  linear_forward(xn_.ptr, hid, W(kQProj), qkv, qkv_dim, hid, qkv_dim);  // q|k|v in one GEMM
  // The k heads follow the q heads in each row with the same head_dim: one rotation over both.
  ops_.rope_forward(qkv, qkv_dim, n, c.num_attention_heads + c.num_key_value_heads, c.head_dim, cos, sin);
  ops_.attention_forward(
      AttentionShape{shape_.batch, shape_.seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim}, qkv, qkv_dim,
      act_at(qkv, q_dim), qkv_dim, act_at(qkv, q_dim + kv_dim), qkv_dim, cache.attn.ptr, q_dim, lse);
  linear_forward(cache.attn.ptr, q_dim, W(kOProj), y_.ptr, hid, q_dim, hid);

  // MLP block: h = x + o (the residual add fused with the norm that reads it).
  ops_.add_rmsnorm_forward(x, y_.ptr, cache.h.ptr, W(kPostAttentionLayernorm), xn_.ptr, rstd2, n, hid, eps_);
  linear_forward(xn_.ptr, hid, W(kGateProj), cache.gu.ptr, 2 * inter, hid, 2 * inter);  // gate|up
  ops_.swiglu_forward(cache.gu.ptr, mlp_act_.ptr, n, inter);
  cache.valid = true;
  if (y == nullptr) return;
  linear_forward(mlp_act_.ptr, inter, W(kDownProj), y, hid, inter, hid);
  ops_.add(cache.h.ptr, y, y, n * hid);
}

void ModelRunner::layer_forward(int64_t layer, const void* w) {
  check_layer(layer, "layer_forward");
  forward_into(w, layer_input(layer), layer_input(layer + 1), cache_of(layer));
}

void ModelRunner::layer_backward(int64_t layer, const void* w, float* g) {
  check_layer(layer, "layer_backward");
  const ModelConfig& c = config_;
  const int64_t n = shape_.tokens(), hid = c.hidden_size, inter = c.intermediate_size, qkv_dim = c.qkv_dim();
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const float* cos = static_cast<const float*>(cos_.ptr);
  const float* sin = static_cast<const float*>(sin_.ptr);
  auto W = [&](LayerParam p) { return act_at(w, offsets_[p]); };
  auto G = [&](LayerParam p) { return g + offsets_[p]; };
  const void* x = layer_input(layer);
  const void* dy = dx_.ptr;
  void* dx = dx_.ptr;  // aliases dy: dy is read for the last time before dx is written

  Cache& cache = cache_of(layer);
  if (checkpointing_) {
    forward_into(w, x, nullptr, cache);  // leaves xn_ and mlp_act_ as the MLP backward reads them
  } else if (!cache.valid || cache.shape.batch != shape_.batch || cache.shape.seq != shape_.seq) {
    throw zero3::InvalidArgument("ModelRunner::layer_backward: layer " + std::to_string(layer) +
                                 " has no forward activations for this batch; run layer_forward first or turn "
                                 "activation checkpointing on");
  }
  const void* h = cache.h.ptr;
  void* dh = dh_.ptr;

  // MLP block: y = h + down(swiglu(gate_up(norm2(h)))). Without checkpointing later layers have overwritten the
  // workspace: norm2(h) and swiglu recomputed from the cache.
  if (!checkpointing_) {
    ops_.rmsnorm_forward(h, W(kPostAttentionLayernorm), xn_.ptr, nullptr, n, hid, eps_);
    ops_.swiglu_forward(cache.gu.ptr, mlp_act_.ptr, n, inter);
  }
  void* dact = dmid_.ptr;
  linear_backward(mlp_act_.ptr, inter, W(kDownProj), dy, hid, dact, inter, G(kDownProj), inter, hid, false);
  void* dgu = dwide_.ptr;
  ops_.swiglu_backward(cache.gu.ptr, dact, dgu, n, inter);
  void* dxn2 = y_.ptr;  // free here: a recomputed forward's output is not needed
  linear_backward(xn_.ptr, hid, W(kGateProj), dgu, 2 * inter, dxn2, hid, G(kGateProj), hid, 2 * inter, false);
  // dh = dy (the residual branch) + the norm's input gradient.
  ops_.rmsnorm_backward(h, W(kPostAttentionLayernorm), static_cast<const float*>(cache.rstd2.ptr), dxn2, dy, dh,
                        G(kPostAttentionLayernorm), n, hid);

  // Attention block: h = x + o(attention(rope(qkv(norm1(x))))).
  void* dattn = dmid_.ptr;
  linear_backward(cache.attn.ptr, q_dim, W(kOProj), dh, hid, dattn, q_dim, G(kOProj), q_dim, hid, false);
  void* dqkv = dwide_.ptr;
  const void* qkv = cache.qkv.ptr;
  ops_.attention_backward(
      AttentionShape{shape_.batch, shape_.seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim}, qkv, qkv_dim,
      act_at(qkv, q_dim), qkv_dim, act_at(qkv, q_dim + kv_dim), qkv_dim, cache.attn.ptr, q_dim,
      static_cast<const float*>(cache.lse.ptr), dattn, q_dim, dqkv, qkv_dim, act_at(dqkv, q_dim), qkv_dim,
      act_at(dqkv, q_dim + kv_dim), qkv_dim);
  ops_.rope_backward(dqkv, qkv_dim, n, c.num_attention_heads + c.num_key_value_heads, c.head_dim, cos, sin);
  ops_.rmsnorm_forward(x, W(kInputLayernorm), xn_.ptr, nullptr, n, hid, eps_);
  void* dxn1 = y_.ptr;
  linear_backward(xn_.ptr, hid, W(kQProj), dqkv, qkv_dim, dxn1, hid, G(kQProj), hid, qkv_dim, false);
  // dx = dh + the norm's input gradient (dx aliases dy, read for the last time above).
  ops_.rmsnorm_backward(x, W(kInputLayernorm), static_cast<const float*>(cache.rstd1.ptr), dxn1, dh, dx,
                        G(kInputLayernorm), n, hid);
}

LossResult ModelRunner::head_forward_backward(const void* w, float* g, const LossOptions& opt, const void* embed_w,
                                              float* embed_g) {
  return head(w, g, embed_w, embed_g, opt, "head_forward_backward");
}

LossResult ModelRunner::head_forward_loss(const void* w, const LossOptions& opt, const void* embed_w) {
  return head(w, nullptr, embed_w, nullptr, opt, "head_forward_loss");
}

LossResult ModelRunner::head(const void* w, float* g, const void* embed_w, float* embed_g, const LossOptions& opt,
                             const char* what) {
  check_ends(false, what);
  const bool tied = config_.tie_word_embeddings;
  const bool valid =
      tied ? embed_w != nullptr && (g == nullptr) == (embed_g == nullptr) : embed_w == nullptr && embed_g == nullptr;
  if (!valid) {
    throw zero3::InvalidArgument(
        std::string("ModelRunner::") + what +
        (tied ? ": tied embeddings: the LM head is the embedding unit's weight, pass its parameters (and, with "
                "gradients, its gradient buffer)"
              : ": untied embeddings: the LM head is in the head unit, pass no embedding buffers"));
  }
  if (loss_deferred_ && !opt.defer_loss_sum) {
    throw zero3::InvalidArgument(std::string("ModelRunner::") + what +
                                 ": the loss sums of deferred heads are still pending; call take_loss_sum() before a "
                                 "head that returns its loss");
  }
  const int64_t n = shape_.tokens(), hid = config_.hidden_size, vocab = config_.vocab_size;
  const int64_t count = count_targets(host_targets_.data(), n, vocab);
  const double normalizer = opt.normalizer > 0 ? opt.normalizer : static_cast<double>(count);
  const void* x = layer_input(config_.num_hidden_layers);
  const void* norm = w;
  const void* lm_head = tied ? embed_w : act_at(w, head_lm_offset_);
  float* lm_head_grad = g == nullptr ? nullptr : tied ? embed_g : g + head_lm_offset_;
  float* rstd = static_cast<float*>(head_rstd_.ptr);
  void* xn = xn_.ptr;                            // normalised final states
  void* dxn = g != nullptr ? dh_.ptr : nullptr;  // their gradient (none without g)
  ops_.rmsnorm_forward(x, norm, xn, rstd, n, hid, eps_);
  const float grad_scale = normalizer > 0 ? static_cast<float>(1.0 / normalizer) : 0.0f;
  // opt.chunk_rows <= 0: the backend's own chunk (the CPU's cache-sized one, the GPU's planned one).
  ops_.lm_head_cross_entropy(xn, lm_head, static_cast<const int32_t*>(targets_.ptr), host_targets_.data(), n, hid,
                             vocab, grad_scale, dxn, lm_head_grad, opt.chunk_rows);
  if (g != nullptr) ops_.rmsnorm_backward(x, norm, rstd, dxn, nullptr, dx_.ptr, g, n, hid);
  LossResult r;
  r.count = count;
  r.normalizer = normalizer;
  if (opt.defer_loss_sum) {
    loss_deferred_ = true;
    r.loss_sum = r.loss = std::numeric_limits<double>::quiet_NaN();
  } else {
    r.loss_sum = ops_.take_loss_sum();
    r.loss = normalizer > 0 ? r.loss_sum / normalizer : 0.0;
  }
  return r;
}

double ModelRunner::take_loss_sum() {
  loss_deferred_ = false;
  return ops_.take_loss_sum();
}

}  // namespace llama3

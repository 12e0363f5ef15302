#include "llama_model.hpp"

#include <algorithm>
#include <random>

#include "ops/attention.hpp"
#include "ops/embedding.hpp"
#include "ops/linear.hpp"
#include "ops/parallel.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/swiglu.hpp"
#include "zero3/error.hpp"

namespace llama3 {
namespace {

template <typename T>
void ensure(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

void check_shape(const ModelConfig& c, const BatchShape& s, const char* what) {
  if (s.batch <= 0 || s.seq <= 0) {
    throw zero3::InvalidArgument(std::string(what) + ": batch " + std::to_string(s.batch) + " and seq " +
                                 std::to_string(s.seq) + " must both be > 0");
  }
}

template <typename T>
void check_rope(const RopeTable<T>& rope, const ModelConfig& c, const BatchShape& s, const char* what) {
  if (rope.n_tokens != s.tokens() || rope.half * 2 != c.head_dim) {
    throw zero3::InvalidArgument(std::string(what) + ": the rope table has " + std::to_string(rope.n_tokens) +
                                 " rows of " + std::to_string(rope.half * 2) + " angles, expected " +
                                 std::to_string(s.tokens()) + " tokens of head_dim " + std::to_string(c.head_dim));
  }
}

AttentionShape attention_shape(const ModelConfig& c, const BatchShape& s) {
  return {s.batch, s.seq, c.num_attention_heads, c.num_key_value_heads, c.head_dim};
}

template <typename T>
AttentionIO<T> attention_io(const ModelConfig& c, const T* qkv) {
  const int64_t ld = c.qkv_dim();
  return {qkv, ld, qkv + c.q_dim(), ld, qkv + c.q_dim() + c.kv_dim(), ld};
}

int64_t wide_width(const ModelConfig& c) { return std::max(2 * c.intermediate_size, c.qkv_dim()); }
int64_t mid_width(const ModelConfig& c) { return std::max(c.intermediate_size, c.q_dim()); }

}  // namespace

std::vector<int32_t> default_positions(const BatchShape& s) {
  std::vector<int32_t> pos(static_cast<size_t>(s.tokens()));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.seq; ++t) pos[b * s.seq + t] = static_cast<int32_t>(t);
  return pos;
}

template <typename T>
void LayerCache<T>::release() {
  *this = LayerCache<T>{};
}

template <typename T>
void LayerWorkspace<T>::release() {
  *this = LayerWorkspace<T>{};
}

int64_t layer_cache_elements(const ModelConfig& c, const BatchShape& s) {
  const int64_t n = s.tokens();
  return n * (2 + c.qkv_dim() + c.q_dim() + c.hidden_size + 2 * c.intermediate_size) +
         s.batch * c.num_attention_heads * s.seq;
}

int64_t layer_workspace_elements(const ModelConfig& c, const BatchShape& s) {
  const int64_t n = s.tokens();
  return n * (3 * c.hidden_size + c.intermediate_size + wide_width(c) + mid_width(c)) + 2 * s.seq * s.seq;
}

// ---- embedding ----

template <typename T>
void embed_forward(const ModelConfig& c, EmbeddingView<const T> w, const int32_t* ids, int64_t tokens, T* x) {
  embedding_forward(ids, tokens, w.embed_tokens, c.vocab_size, c.hidden_size, x);
}

template <typename T>
void embed_backward(const ModelConfig& c, const int32_t* ids, int64_t tokens, const T* dx, EmbeddingView<T> g) {
  embedding_backward(ids, tokens, dx, c.vocab_size, c.hidden_size, g.embed_tokens);
}

// ---- layer ----

template <typename T>
void layer_forward(const ModelConfig& c, LayerView<const T> w, const T* x, T* y, const BatchShape& s,
                   const RopeTable<T>& rope, LayerCache<T>& cache, LayerWorkspace<T>& ws) {
  check_shape(c, s, "layer_forward");
  check_rope(rope, c, s, "layer_forward");
  const int64_t n = s.tokens(), hid = c.hidden_size, inter = c.intermediate_size, qkv_dim = c.qkv_dim();
  const T eps = static_cast<T>(c.rms_norm_eps);
  cache.valid = false;
  cache.shape = s;
  ensure(cache.rstd1, n);
  ensure(cache.qkv, n * qkv_dim);
  ensure(cache.lse, s.batch * c.num_attention_heads * s.seq);
  ensure(cache.attn, n * c.q_dim());
  ensure(cache.h, n * hid);
  ensure(cache.rstd2, n);
  ensure(cache.gu, n * 2 * inter);
  ensure(ws.xn, n * hid);
  ensure(ws.act, n * inter);

  // Attention block.
  rmsnorm_forward(x, w.input_layernorm, ws.xn.data(), cache.rstd1.data(), n, hid, eps);
  linear_forward(ws.xn.data(), hid, w.q_proj, cache.qkv.data(), qkv_dim, n, hid, qkv_dim);  // q|k|v in one GEMM
  rope_forward(cache.qkv.data(), qkv_dim, c.num_attention_heads, c.head_dim, rope);
  rope_forward(cache.qkv.data() + c.q_dim(), qkv_dim, c.num_key_value_heads, c.head_dim, rope);
  attention_forward(attention_shape(c, s), attention_io(c, static_cast<const T*>(cache.qkv.data())), cache.attn.data(),
                    c.q_dim(), cache.lse.data());
  linear_forward(cache.attn.data(), c.q_dim(), w.o_proj, y, hid, n, c.q_dim(), hid);
  T* h = cache.h.data();
#pragma omp parallel for schedule(static) if (n * hid >= kParallelMinWork)
  for (int64_t i = 0; i < n * hid; ++i) h[i] = x[i] + y[i];

  // MLP block.
  rmsnorm_forward(static_cast<const T*>(h), w.post_attention_layernorm, ws.xn.data(), cache.rstd2.data(), n, hid, eps);
  linear_forward(ws.xn.data(), hid, w.gate_proj, cache.gu.data(), 2 * inter, n, hid, 2 * inter);  // gate|up
  swiglu_forward(static_cast<const T*>(cache.gu.data()), ws.act.data(), n, inter);
  linear_forward(ws.act.data(), inter, w.down_proj, y, hid, n, inter, hid);
#pragma omp parallel for schedule(static) if (n * hid >= kParallelMinWork)
  for (int64_t i = 0; i < n * hid; ++i) y[i] = h[i] + y[i];
  cache.valid = true;
}

template <typename T>
void layer_backward(const ModelConfig& c, LayerView<const T> w, const T* x, const T* dy, T* dx, LayerView<T> g,
                    const BatchShape& s, const RopeTable<T>& rope, LayerCache<T>& cache, LayerWorkspace<T>& ws,
                    bool recompute) {
  check_shape(c, s, "layer_backward");
  check_rope(rope, c, s, "layer_backward");
  const int64_t n = s.tokens(), hid = c.hidden_size, inter = c.intermediate_size, qkv_dim = c.qkv_dim();
  const T eps = static_cast<T>(c.rms_norm_eps);
  if (recompute) {
    ensure(ws.y, n * hid);
    layer_forward(c, w, x, ws.y.data(), s, rope, cache, ws);
  } else if (!cache.valid || cache.shape.batch != s.batch || cache.shape.seq != s.seq) {
    throw zero3::InvalidArgument(
        "layer_backward: the cache holds no forward activations for this batch shape; run layer_forward first or "
        "pass recompute = true (activation checkpointing)");
  }
  ensure(ws.xn, n * hid);
  ensure(ws.act, n * inter);
  ensure(ws.dh, n * hid);
  ensure(ws.dwide, n * wide_width(c));
  ensure(ws.dmid, n * mid_width(c));
  const T* h = cache.h.data();
  T* dh = ws.dh.data();

  // MLP block: y = h + down(swiglu(gate_up(norm2(h)))).
  rmsnorm_forward(h, w.post_attention_layernorm, ws.xn.data(), static_cast<T*>(nullptr), n, hid, eps);
  swiglu_forward(static_cast<const T*>(cache.gu.data()), ws.act.data(), n, inter);
  T* dact = ws.dmid.data();
  linear_backward(static_cast<const T*>(ws.act.data()), inter, w.down_proj, dy, hid, dact, inter, g.down_proj, n, inter,
                  hid, false);
  T* dgu = ws.dwide.data();
  swiglu_backward(static_cast<const T*>(cache.gu.data()), static_cast<const T*>(dact), dgu, n, inter);
  ensure(ws.y, n * hid);  // free here: a recomputed forward's output is not needed
  T* dxn2 = ws.y.data();
  linear_backward(static_cast<const T*>(ws.xn.data()), hid, w.gate_proj, static_cast<const T*>(dgu), 2 * inter, dxn2,
                  hid, g.gate_proj, n, hid, 2 * inter, false);
  std::copy(dy, dy + n * hid, dh);
  rmsnorm_backward(h, w.post_attention_layernorm, static_cast<const T*>(cache.rstd2.data()),
                   static_cast<const T*>(dxn2), dh, g.post_attention_layernorm, n, hid, true);

  // Attention block: h = x + o(attention(rope(qkv(norm1(x))))).
  T* dattn = ws.dmid.data();
  linear_backward(static_cast<const T*>(cache.attn.data()), c.q_dim(), w.o_proj, static_cast<const T*>(dh), hid, dattn,
                  c.q_dim(), g.o_proj, n, c.q_dim(), hid, false);
  T* dqkv = ws.dwide.data();
  attention_backward(attention_shape(c, s), attention_io(c, static_cast<const T*>(cache.qkv.data())),
                     static_cast<const T*>(cache.lse.data()), static_cast<const T*>(dattn), c.q_dim(), dqkv, qkv_dim,
                     dqkv + c.q_dim(), qkv_dim, dqkv + c.q_dim() + c.kv_dim(), qkv_dim);
  rope_backward(dqkv, qkv_dim, c.num_attention_heads, c.head_dim, rope);
  rope_backward(dqkv + c.q_dim(), qkv_dim, c.num_key_value_heads, c.head_dim, rope);
  rmsnorm_forward(x, w.input_layernorm, ws.xn.data(), static_cast<T*>(nullptr), n, hid, eps);
  T* dxn1 = ws.y.data();
  linear_backward(static_cast<const T*>(ws.xn.data()), hid, w.q_proj, static_cast<const T*>(dqkv), qkv_dim, dxn1, hid,
                  g.q_proj, n, hid, qkv_dim, false);
  // dx may alias dy: dy is no longer read from here on.
  std::copy(dh, dh + n * hid, dx);
  rmsnorm_backward(x, w.input_layernorm, static_cast<const T*>(cache.rstd1.data()), static_cast<const T*>(dxn1), dx,
                   g.input_layernorm, n, hid, true);
}

// ---- head ----

namespace {

template <typename T>
LossResult finish(const CrossEntropyResult& ce, double normalizer) {
  LossResult r;
  r.loss_sum = ce.loss_sum;
  r.count = ce.count;
  r.normalizer = normalizer;
  r.loss = normalizer > 0 ? ce.loss_sum / normalizer : 0.0;
  return r;
}

double pick_normalizer(const LossOptions& opt, int64_t count) {
  return opt.normalizer > 0 ? opt.normalizer : static_cast<double>(count);
}

template <typename T>
void check_lm_head(const T* lm_head, const char* what) {
  if (lm_head == nullptr) {
    throw zero3::InvalidArgument(std::string(what) +
                                 ": the head view has no lm_head (with tied embeddings set it to the embedding's "
                                 "embed_tokens, as model_view does)");
  }
}

}  // namespace

template <typename T>
LossResult head_forward_backward(const ModelConfig& c, HeadView<const T> w, const T* x, const int32_t* targets,
                                 int64_t tokens, T* dx, HeadView<T> g, const LossOptions& opt) {
  check_lm_head(w.lm_head, "head_forward_backward");
  const int64_t hid = c.hidden_size;
  const double normalizer = pick_normalizer(opt, count_targets(targets, tokens, c.vocab_size));
  std::vector<T> xn(static_cast<size_t>(tokens * hid)), rstd(static_cast<size_t>(tokens)),
      dxn(static_cast<size_t>(tokens * hid));
  rmsnorm_forward(x, w.norm, xn.data(), rstd.data(), tokens, hid, static_cast<T>(c.rms_norm_eps));
  const T grad_scale = normalizer > 0 ? static_cast<T>(1.0 / normalizer) : T(0);
  CrossEntropyResult ce = lm_head_cross_entropy(static_cast<const T*>(xn.data()), w.lm_head, targets, tokens, hid,
                                                c.vocab_size, grad_scale, dxn.data(), g.lm_head, opt.chunk_rows);
  rmsnorm_backward(x, w.norm, static_cast<const T*>(rstd.data()), static_cast<const T*>(dxn.data()), dx, g.norm, tokens,
                   hid, false);
  return finish<T>(ce, normalizer);
}

template <typename T>
LossResult head_loss(const ModelConfig& c, HeadView<const T> w, const T* x, const int32_t* targets, int64_t tokens,
                     const LossOptions& opt) {
  check_lm_head(w.lm_head, "head_loss");
  const int64_t hid = c.hidden_size;
  const double normalizer = pick_normalizer(opt, count_targets(targets, tokens, c.vocab_size));
  std::vector<T> xn(static_cast<size_t>(tokens * hid));
  rmsnorm_forward(x, w.norm, xn.data(), static_cast<T*>(nullptr), tokens, hid, static_cast<T>(c.rms_norm_eps));
  CrossEntropyResult ce =
      lm_head_cross_entropy(static_cast<const T*>(xn.data()), w.lm_head, targets, tokens, hid, c.vocab_size, T(0),
                            static_cast<T*>(nullptr), static_cast<T*>(nullptr), opt.chunk_rows);
  return finish<T>(ce, normalizer);
}

template <typename T>
void head_logits(const ModelConfig& c, HeadView<const T> w, const T* x, int64_t tokens, T* logits) {
  check_lm_head(w.lm_head, "head_logits");
  const int64_t hid = c.hidden_size;
  std::vector<T> xn(static_cast<size_t>(tokens * hid));
  rmsnorm_forward(x, w.norm, xn.data(), static_cast<T*>(nullptr), tokens, hid, static_cast<T>(c.rms_norm_eps));
  linear_forward(static_cast<const T*>(xn.data()), hid, w.lm_head, logits, c.vocab_size, tokens, hid, c.vocab_size);
}

// ---- whole model ----

template <typename T>
ModelView<T> model_view(const ModelConfig& c, const std::vector<T*>& units) {
  if (static_cast<int64_t>(units.size()) != c.num_hidden_layers + 2) {
    throw zero3::InvalidArgument("model_view: " + std::to_string(units.size()) + " unit buffers, expected " +
                                 std::to_string(c.num_hidden_layers + 2) + " (embedding, layers, head)");
  }
  ModelView<T> v;
  v.embedding = embedding_view(c, units.front());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) v.layers.push_back(layer_view(c, units[1 + i]));
  v.head = head_view(c, units.back());
  if (c.tie_word_embeddings) v.head.lm_head = v.embedding.embed_tokens;  // gradients of both uses add up there
  return v;
}

namespace {

// The forward pass up to the final hidden states; resid[i] is layer i's input, resid[L] the output.
template <typename T>
void run_layers_forward(const ModelConfig& c, const ModelView<const T>& p, const int32_t* ids, const BatchShape& s,
                        const RopeTable<T>& rope, std::vector<std::vector<T>>& resid,
                        std::vector<LayerCache<T>>& caches, LayerWorkspace<T>& ws) {
  const int64_t L = c.num_hidden_layers, n = s.tokens();
  resid.assign(static_cast<size_t>(L + 1), std::vector<T>(static_cast<size_t>(n * c.hidden_size)));
  embed_forward(c, p.embedding, ids, n, resid[0].data());
  for (int64_t i = 0; i < L; ++i) {
    LayerCache<T>& cache = caches[caches.size() == 1 ? 0 : static_cast<size_t>(i)];
    layer_forward(c, p.layers[i], static_cast<const T*>(resid[i].data()), resid[i + 1].data(), s, rope, cache, ws);
  }
}

template <typename T>
RopeTable<T> batch_rope(const ModelConfig& c, const int32_t* positions, const BatchShape& s) {
  check_shape(c, s, "model");
  std::vector<int32_t> pos;
  if (positions == nullptr) {
    pos = default_positions(s);
    positions = pos.data();
  }
  return make_rope_table<T>(rope_inv_freq(c), positions, s.tokens());
}

}  // namespace

template <typename T>
LossResult model_forward_backward(const ModelConfig& c, const ModelView<const T>& p, const ModelView<T>& g,
                                  const int32_t* ids, const int32_t* targets, const int32_t* positions,
                                  const BatchShape& s, const ModelOptions& opt) {
  const RopeTable<T> rope = batch_rope<T>(c, positions, s);
  const int64_t L = c.num_hidden_layers, n = s.tokens();
  // Checkpointing keeps only the layer inputs (resid) and shares one cache that backward refills per layer.
  std::vector<LayerCache<T>> caches(opt.activation_checkpointing ? 1 : static_cast<size_t>(L));
  LayerWorkspace<T> ws;
  std::vector<std::vector<T>> resid;
  run_layers_forward(c, p, ids, s, rope, resid, caches, ws);
  std::vector<T> grad(static_cast<size_t>(n * c.hidden_size));
  LossResult loss = head_forward_backward(c, p.head, static_cast<const T*>(resid[L].data()), targets, n, grad.data(),
                                          g.head, opt.loss);
  for (int64_t i = L - 1; i >= 0; --i) {
    LayerCache<T>& cache = caches[opt.activation_checkpointing ? 0 : static_cast<size_t>(i)];
    layer_backward(c, p.layers[i], static_cast<const T*>(resid[i].data()), static_cast<const T*>(grad.data()),
                   grad.data(), g.layers[i], s, rope, cache, ws, opt.activation_checkpointing);
    if (!opt.activation_checkpointing) cache.release();
  }
  embed_backward(c, ids, n, static_cast<const T*>(grad.data()), g.embedding);
  return loss;
}

template <typename T>
LossResult model_loss(const ModelConfig& c, const ModelView<const T>& p, const int32_t* ids, const int32_t* targets,
                      const int32_t* positions, const BatchShape& s, const LossOptions& opt) {
  const RopeTable<T> rope = batch_rope<T>(c, positions, s);
  std::vector<LayerCache<T>> caches(1);
  LayerWorkspace<T> ws;
  std::vector<std::vector<T>> resid;
  run_layers_forward(c, p, ids, s, rope, resid, caches, ws);
  return head_loss(c, p.head, static_cast<const T*>(resid.back().data()), targets, s.tokens(), opt);
}

template <typename T>
void model_logits(const ModelConfig& c, const ModelView<const T>& p, const int32_t* ids, const int32_t* positions,
                  const BatchShape& s, T* logits) {
  const RopeTable<T> rope = batch_rope<T>(c, positions, s);
  std::vector<LayerCache<T>> caches(1);
  LayerWorkspace<T> ws;
  std::vector<std::vector<T>> resid;
  run_layers_forward(c, p, ids, s, rope, resid, caches, ws);
  head_logits(c, p.head, static_cast<const T*>(resid.back().data()), s.tokens(), logits);
}

// ---- FlatModel ----

template <typename T>
FlatModel<T>::FlatModel(const ModelConfig& config) : config_(config), units_(model_unit_layouts(config)) {
  for (const UnitLayout& u : units_) {
    params_.emplace_back(static_cast<size_t>(u.numel), T(0));
    grads_.emplace_back(static_cast<size_t>(u.numel), T(0));
  }
}

template <typename T>
std::pair<size_t, const ParamSpec*> FlatModel<T>::find(const std::string& name) const {
  int64_t unit = unit_of_param(config_, name);
  if (unit < 0) throw zero3::InvalidArgument("the Llama model has no parameter named " + name);
  return {static_cast<size_t>(unit), &units_[static_cast<size_t>(unit)].param(name)};
}

template <typename T>
T* FlatModel<T>::param(const std::string& name) {
  auto [unit, spec] = find(name);
  return params_[unit].data() + spec->offset;
}

template <typename T>
T* FlatModel<T>::grad(const std::string& name) {
  auto [unit, spec] = find(name);
  return grads_[unit].data() + spec->offset;
}

template <typename T>
const ParamSpec& FlatModel<T>::spec(const std::string& name) const {
  return *find(name).second;
}

template <typename T>
ModelView<const T> FlatModel<T>::params() const {
  std::vector<const T*> ptrs;
  for (const auto& p : params_) ptrs.push_back(p.data());
  return model_view(config_, ptrs);
}

template <typename T>
ModelView<T> FlatModel<T>::grads() {
  std::vector<T*> ptrs;
  for (auto& g : grads_) ptrs.push_back(g.data());
  return model_view(config_, ptrs);
}

template <typename T>
void FlatModel<T>::zero_grads() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), T(0));
}

template <typename T>
void FlatModel<T>::init_random(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t u = 0; u < units_.size(); ++u) {
    for (const ParamSpec& p : units_[u].params) {
      T* dst = params_[u].data() + p.offset;
      if (p.init == ParamInit::ones) {
        std::fill(dst, dst + p.numel, T(1));
      } else {
        std::normal_distribution<double> dist(0.0, p.init_std);
        for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<T>(dist(rng));
      }
    }
  }
}

// ---- instantiations ----

#define LLAMA3_INSTANTIATE(T)                                                                                        \
  template struct LayerCache<T>;                                                                                     \
  template struct LayerWorkspace<T>;                                                                                 \
  template void embed_forward<T>(const ModelConfig&, EmbeddingView<const T>, const int32_t*, int64_t, T*);           \
  template void embed_backward<T>(const ModelConfig&, const int32_t*, int64_t, const T*, EmbeddingView<T>);          \
  template void layer_forward<T>(const ModelConfig&, LayerView<const T>, const T*, T*, const BatchShape&,            \
                                 const RopeTable<T>&, LayerCache<T>&, LayerWorkspace<T>&);                           \
  template void layer_backward<T>(const ModelConfig&, LayerView<const T>, const T*, const T*, T*, LayerView<T>,      \
                                  const BatchShape&, const RopeTable<T>&, LayerCache<T>&, LayerWorkspace<T>&, bool); \
  template LossResult head_forward_backward<T>(const ModelConfig&, HeadView<const T>, const T*, const int32_t*,      \
                                               int64_t, T*, HeadView<T>, const LossOptions&);                        \
  template LossResult head_loss<T>(const ModelConfig&, HeadView<const T>, const T*, const int32_t*, int64_t,         \
                                   const LossOptions&);                                                              \
  template void head_logits<T>(const ModelConfig&, HeadView<const T>, const T*, int64_t, T*);                        \
  template ModelView<T> model_view<T>(const ModelConfig&, const std::vector<T*>&);                                   \
  template ModelView<const T> model_view<const T>(const ModelConfig&, const std::vector<const T*>&);                 \
  template LossResult model_forward_backward<T>(const ModelConfig&, const ModelView<const T>&, const ModelView<T>&,  \
                                                const int32_t*, const int32_t*, const int32_t*, const BatchShape&,   \
                                                const ModelOptions&);                                                \
  template LossResult model_loss<T>(const ModelConfig&, const ModelView<const T>&, const int32_t*, const int32_t*,   \
                                    const int32_t*, const BatchShape&, const LossOptions&);                          \
  template void model_logits<T>(const ModelConfig&, const ModelView<const T>&, const int32_t*, const int32_t*,       \
                                const BatchShape&, T*);                                                              \
  template class FlatModel<T>;

LLAMA3_INSTANTIATE(float)
LLAMA3_INSTANTIATE(double)

}  // namespace llama3

// The Llama-3 forward and backward passes over plain buffers, one function per zero3 unit.
//
// Parameters arrive as views into a unit's flat buffer (layout in llama_layout.hpp); gradients are written
// into a flat buffer of the same layout, always accumulated (+=), so gradient accumulation over micro-batches
// and the engine's reduce-scatter input are the same buffer. Activations are row-major with one row per
// token: (batch, seq, hidden) = (tokens, hidden), tokens = batch * seq, row r = b * seq + t.
//
// Precision: T = float is the model (float32 end to end, as LlamaForCausalLM in float32); T = double runs the
// same code in double, which the tests use as the reference for finite differences.
//
// Threads: every function blocks until done and uses OpenMP (and OpenBLAS) threads internally; a LayerCache
// or LayerWorkspace is used by one call at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama_layout.hpp"
#include "model_config.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/rope.hpp"

namespace llama3 {

// ---- Views: typed pointers into a unit's flat buffer (T = const float for parameters, float for grads). ----

template <typename T>
struct EmbeddingView {
  T* embed_tokens = nullptr;  // (vocab, hidden)
};

template <typename T>
struct LayerView {
  T* input_layernorm = nullptr;           // (hidden)
  T* q_proj = nullptr;                    // (n_heads*head_dim, hidden)   q, k, v adjacent: one (qkv_dim, hidden)
  T* k_proj = nullptr;                    // (n_kv_heads*head_dim, hidden)
  T* v_proj = nullptr;                    // (n_kv_heads*head_dim, hidden)
  T* o_proj = nullptr;                    // (hidden, n_heads*head_dim)
  T* post_attention_layernorm = nullptr;  // (hidden)
  T* gate_proj = nullptr;                 // (intermediate, hidden)       gate, up adjacent: one (2*inter, hidden)
  T* up_proj = nullptr;                   // (intermediate, hidden)
  T* down_proj = nullptr;                 // (hidden, intermediate)
};

template <typename T>
struct HeadView {
  T* norm = nullptr;     // (hidden)
  T* lm_head = nullptr;  // (vocab, hidden); with tied embeddings the embedding unit's embed_tokens (not in the
                         // head unit: head_view leaves it null, model_view points it at the embedding)
};

template <typename T>
EmbeddingView<T> embedding_view(const ModelConfig& c, T* flat) {
  return {flat};
}

template <typename T>
LayerView<T> layer_view(const ModelConfig& c, T* flat) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  LayerView<T> v;
  v.input_layernorm = flat;
  v.q_proj = v.input_layernorm + h;
  v.k_proj = v.q_proj + c.q_dim() * h;
  v.v_proj = v.k_proj + c.kv_dim() * h;
  v.o_proj = v.v_proj + c.kv_dim() * h;
  v.post_attention_layernorm = v.o_proj + h * c.q_dim();
  v.gate_proj = v.post_attention_layernorm + h;
  v.up_proj = v.gate_proj + inter * h;
  v.down_proj = v.up_proj + inter * h;
  return v;
}

template <typename T>
HeadView<T> head_view(const ModelConfig& c, T* flat) {
  return {flat, c.tie_word_embeddings ? nullptr : flat + c.hidden_size};
}

// ---- Shapes and saved state. ----

struct BatchShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t tokens() const { return batch * seq; }
};

// 0, 1, ..., seq-1 for each sequence (Hugging Face's default position_ids).
std::vector<int32_t> default_positions(const BatchShape& shape);

// What one layer's forward keeps for its backward. With activation checkpointing one LayerCache serves every
// layer: backward recomputes the layer's forward into it from the layer input.
template <typename T>
struct LayerCache {
  BatchShape shape;
  bool valid = false;
  std::vector<T> rstd1;  // (tokens)                input_layernorm 1/rms
  std::vector<T> qkv;    // (tokens, qkv_dim)       projections, q and k rotated
  std::vector<T> lse;    // (batch, n_heads, seq)   attention log-sum-exp
  std::vector<T> attn;   // (tokens, n_heads*hd)    attention output, o_proj input
  std::vector<T> h;      // (tokens, hidden)        residual stream after attention
  std::vector<T> rstd2;  // (tokens)                post_attention_layernorm 1/rms
  std::vector<T> gu;     // (tokens, 2*inter)       gate and up projections
  void release();        // frees the memory
};

// Elements a LayerCache holds for `shape` (for memory plans; multiply by the element size).
int64_t layer_cache_elements(const ModelConfig& config, const BatchShape& shape);

// Scratch shared by all layers' forward and backward.
template <typename T>
struct LayerWorkspace {
  std::vector<T> xn;     // (tokens, hidden)
  std::vector<T> act;    // (tokens, inter)
  std::vector<T> y;      // (tokens, hidden)   output of a recomputed forward
  std::vector<T> dh;     // (tokens, hidden)
  std::vector<T> dwide;  // (tokens, max(2*inter, qkv_dim))
  std::vector<T> dmid;   // (tokens, max(inter, n_heads*hd))
  void release();
};

int64_t layer_workspace_elements(const ModelConfig& config, const BatchShape& shape);

// ---- Units. ----

// x (tokens, hidden) = embed_tokens[ids]. Throws zero3::InvalidArgument for an id outside the vocabulary.
template <typename T>
void embed_forward(const ModelConfig& c, EmbeddingView<const T> w, const int32_t* ids, int64_t tokens, T* x);

// g.embed_tokens += scatter of dx (tokens, hidden) into the rows of ids.
template <typename T>
void embed_backward(const ModelConfig& c, const int32_t* ids, int64_t tokens, const T* dx, EmbeddingView<T> g);

// One decoder layer: y = h + mlp(post_attention_layernorm(h)), h = x + attn(input_layernorm(x)).
// x and y are (tokens, hidden) and must not overlap. rope: built for the batch's positions (one row per
// token). The activations backward needs go into `cache` (overwritten).
template <typename T>
void layer_forward(const ModelConfig& c, LayerView<const T> w, const T* x, T* y, const BatchShape& shape,
                   const RopeTable<T>& rope, LayerCache<T>& cache, LayerWorkspace<T>& ws);

// Backward of layer_forward: dx (tokens, hidden) = dL/dx (overwritten; may alias dy), g += dL/dparams.
// x is the layer's input (as passed to layer_forward). recompute = true (activation checkpointing) first runs
// the forward again into `cache`; otherwise `cache` must hold this layer's forward for this x.
template <typename T>
void layer_backward(const ModelConfig& c, LayerView<const T> w, const T* x, const T* dy, T* dx, LayerView<T> g,
                    const BatchShape& shape, const RopeTable<T>& rope, LayerCache<T>& cache, LayerWorkspace<T>& ws,
                    bool recompute);

// How the loss is averaged: loss = sum of per-token losses / normalizer, where normalizer <= 0 means the
// number of non-ignored targets of this call (Hugging Face's mean). Pass the token count of the whole
// optimizer step to get one mean across micro-batches and ranks. With no target and normalizer <= 0 the loss
// is 0 and no gradient is produced (Hugging Face would return NaN).
//
// defer_loss_sum (ModelRunner and EngineModel only; this file's functions always return the loss): the loss is not
// read back; the result's loss and loss_sum are NaN and the sum waits in the backend's loss accumulator until
// take_loss_sum() (model_runner.hpp), so a GPU run does not wait on the device once per micro-batch.
struct LossOptions {
  double normalizer = 0;
  int64_t chunk_rows = 0;  // rows of logits at a time; <= 0: default_loss_chunk_rows(vocab)
  bool defer_loss_sum = false;
};

struct LossResult {
  double loss = 0;        // loss_sum / normalizer (NaN when deferred)
  double loss_sum = 0;    // sum over non-ignored targets (NaN when deferred)
  int64_t count = 0;      // non-ignored targets
  double normalizer = 0;  // what loss_sum was divided by (0 when nothing was)
};

// Final norm, LM head and cross-entropy with its backward, chunked over rows (the whole (tokens, vocab) logits
// never exist). targets (tokens): the token each position must predict (already shifted, kIgnoreIndex to
// skip). dx (tokens, hidden) overwritten, g += head gradients.
template <typename T>
LossResult head_forward_backward(const ModelConfig& c, HeadView<const T> w, const T* x, const int32_t* targets,
                                 int64_t tokens, T* dx, HeadView<T> g, const LossOptions& opt = {});

// Forward only.
template <typename T>
LossResult head_loss(const ModelConfig& c, HeadView<const T> w, const T* x, const int32_t* targets, int64_t tokens,
                     const LossOptions& opt = {});

// logits (tokens, vocab) of the final hidden states x (tokens, hidden).
template <typename T>
void head_logits(const ModelConfig& c, HeadView<const T> w, const T* x, int64_t tokens, T* logits);

// ---- The whole model over plain buffers (tests, the single-process reference). ----

template <typename T>
struct ModelView {
  EmbeddingView<T> embedding;
  std::vector<LayerView<T>> layers;
  HeadView<T> head;
};

// units: one flat buffer per unit, in model_unit_layouts order (L + 2 pointers). With tied embeddings the head's
// lm_head is the embedding's embed_tokens, so a gradient view accumulates both uses there.
template <typename T>
ModelView<T> model_view(const ModelConfig& c, const std::vector<T*>& units);

struct ModelOptions {
  bool activation_checkpointing = false;
  LossOptions loss;
};

// ids, targets: (batch, seq); positions: (batch, seq) or nullptr for default_positions.
template <typename T>
LossResult model_forward_backward(const ModelConfig& c, const ModelView<const T>& params, const ModelView<T>& grads,
                                  const int32_t* ids, const int32_t* targets, const int32_t* positions,
                                  const BatchShape& shape, const ModelOptions& opt = {});

template <typename T>
LossResult model_loss(const ModelConfig& c, const ModelView<const T>& params, const int32_t* ids,
                      const int32_t* targets, const int32_t* positions, const BatchShape& shape,
                      const LossOptions& opt = {});

// logits (tokens, vocab).
template <typename T>
void model_logits(const ModelConfig& c, const ModelView<const T>& params, const int32_t* ids, const int32_t* positions,
                  const BatchShape& shape, T* logits);

// All of a model's parameters and gradients in one process: one flat buffer per unit, zero-initialised.
template <typename T>
class FlatModel {
 public:
  explicit FlatModel(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  std::vector<T>& unit_params(size_t unit) { return params_.at(unit); }
  std::vector<T>& unit_grads(size_t unit) { return grads_.at(unit); }
  const std::vector<T>& unit_params(size_t unit) const { return params_.at(unit); }
  const std::vector<T>& unit_grads(size_t unit) const { return grads_.at(unit); }

  // The first element of a parameter (its Hugging Face name) and its spec; throws zero3::InvalidArgument.
  T* param(const std::string& name);
  T* grad(const std::string& name);
  const ParamSpec& spec(const std::string& name) const;

  ModelView<const T> params() const;
  ModelView<T> grads();
  void zero_grads();

  // Hugging Face's init from config: normal(0, initializer_range) weights, ones for norms (std::mt19937_64 seeded
  // with `seed`; the engine's meta init uses its own counter-based generator instead).
  void init_random(uint64_t seed);

 private:
  std::pair<size_t, const ParamSpec*> find(const std::string& name) const;

  ModelConfig config_;
  std::vector<UnitLayout> units_;
  std::vector<std::vector<T>> params_, grads_;
};

}  // namespace llama3

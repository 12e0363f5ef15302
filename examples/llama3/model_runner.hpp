// One micro-batch of the Llama-3 model, unit by unit, on a ModelOps backend: the orchestration of
// llama_model.cpp (embed_forward, layer_forward/backward with recomputation, head_forward_backward) written
// once over backend buffers, so the CPU and the GPU run the same sequence of ops. EngineModel calls it inside
// the engine's gather scopes; on CpuModelOps it gives the bits model_forward_backward gives.
//
// A micro-batch:
//   begin_batch(ids, targets, shape, checkpointing)   uploads ids and targets, rope tables for the shape
//   embed_forward(w)                                   layer input 0
//   layer_forward(i, w)                  i = 0..L-1    layer input i+1 (cache i, or the one shared cache)
//   head_forward_backward(w, g, loss)                  final norm, LM head, loss, dx; returns the loss
//                                                      (evaluation: head_forward_loss(w, loss), then no backward)
//                                                      tied embeddings: (w, g, loss, embed_w, embed_g), the LM
//                                                      head being the embedding unit's weight
//   layer_backward(i, w, g)              i = L-1..0    recomputes layer i's forward first with checkpointing
//   embed_backward(g)
// A pipeline stage runs a contiguous part of this: load_layer_input / store_layer_input where it starts and ends,
// load_grad / store_grad for the gradient of those boundaries.
// Parameters `w`: a unit's flat buffer (llama_layout.hpp) in ops.act(), backend memory. Gradients `g`: the
// unit's flat f32 gradient buffer in backend memory, accumulated (+=). On the cuda backend every call
// queues work and returns (head_forward_backward waits for its loss unless the loss is deferred); the buffers may
// be reused by the next call only in queue order, which the backend's single stream gives.
//
// The loss: by default the head returns it (on cuda, one wait for the device). With LossOptions::defer_loss_sum
// the head returns the count and the normalizer only (loss and loss_sum NaN) and the sum stays in the backend's
// accumulator (ModelOps::take_loss_sum); take_loss_sum() returns the sum over every deferred head since the last
// take, in call order, in double: the same bits as adding the heads' loss_sum on the host. A head that is not
// deferred while deferred sums wait is zero3::InvalidArgument (its sum would mix with theirs).
//
// Buffers (backend memory, act unless noted; grown to the largest shape seen, kept across micro-batches):
//   layer inputs   (L+1) x (tokens, hidden)            the residual stream between units (a layer range's own:
//                                                      end - first + 1)
//   caches         1 (checkpointing) or L x            rstd1 f32 (tokens) | qkv (tokens, q+k+v) | lse f32
//                                                       (batch, heads, seq) | attn (tokens, q) | h (tokens,
//                                                       hidden) | rstd2 f32 | gu (tokens, 2*inter)
//   workspace      xn, y, dh (tokens, hidden), act (tokens, inter), dwide (tokens, max(2*inter, q+k+v)),
//                  dmid (tokens, max(inter, q)); the head reuses xn (normalised states) and dh (their gradient)
//   dx             (tokens, hidden), the gradient flowing backward
//   head rstd      f32 (tokens)
//   batch          ids, targets int32 (tokens); rope cos, sin f32 (tokens, head_dim/2)
//   unit staging   param_staging / grad_staging, for a caller whose parameters or gradients are of other
//                  dtypes (converted by the caller); two slots each, for the head and, tied, the embedding
//
// Errors: zero3::InvalidArgument for a bad shape, token id or target (named), a layer backward with no
// forward for this batch when checkpointing is off, or a call out of order; backend errors as ModelOps says.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/model_ops.hpp"
#include "llama_model.hpp"
#include "model_config.hpp"
#include "zero3/activation_plan.hpp"

namespace llama3 {

// Bytes of each part of a runner's buffers for one shape (act_bytes per activation element): zero3's activation plan
// (zero3/activation_plan.hpp), which `zero3 plan` counts, is the one account of them.
using RunnerBufferSizes = zero3::LlamaRunnerBuffers;
RunnerBufferSizes runner_buffer_sizes(const ModelConfig& config, const BatchShape& shape, bool checkpointing,
                                      int64_t act_bytes);

class ModelRunner {
 public:
  // `ops` must outlive the runner.
  ModelRunner(const ModelConfig& config, ModelOps& ops);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  const ModelConfig& config() const { return config_; }
  ModelOps& ops() const { return ops_; }

  // A pipeline stage's runner runs transformer layers [first, end) only: its residual buffer holds their inputs and
  // the last one's output (end - first + 1 of them, layer_input(first) .. layer_input(end)), its caches are theirs;
  // the embedding needs first = 0, the head end = L. Default: every layer. Takes effect at the next begin_batch.
  // zero3::InvalidArgument for a range outside [0, L].
  void set_layer_range(int64_t first, int64_t end);

  // ids, targets (batch, seq) on the host (targets already shifted, kIgnoreIndex skips); positions are
  // 0..seq-1 in every sequence. Checks the ids and targets, copies them (the host arrays may change after),
  // and sizes the buffers. Every cache is invalid after it.
  void begin_batch(const int32_t* ids, const int32_t* targets, const BatchShape& shape, bool checkpointing);

  void embed_forward(const void* w);
  void layer_forward(int64_t layer, const void* w);
  // The loss over this micro-batch's targets as head_forward_backward (llama_model.hpp) defines it. With tied
  // embeddings the LM head multiplies by the embedding unit's parameters `embed_w` and adds its gradient to that
  // unit's `embed_g`; without, both must be null (the head unit holds lm_head.weight). InvalidArgument otherwise.
  LossResult head_forward_backward(const void* w, float* g, const LossOptions& opt, const void* embed_w = nullptr,
                                   float* embed_g = nullptr);
  // The same loss without gradients (evaluation): final norm, LM head and cross-entropy, no backward.
  LossResult head_forward_loss(const void* w, const LossOptions& opt, const void* embed_w = nullptr);
  // The loss sums of the deferred heads since the last take (0 when none); on cuda, one read and one wait.
  double take_loss_sum();
  void layer_backward(int64_t layer, const void* w, float* g);
  void embed_backward(float* g);

  // A pipeline stage's boundaries (pipeline_model.hpp), after begin_batch; (tokens, hidden) act elements in backend
  // memory. The residual stream entering layer i (i = 0: the embedding's output; i = L: the head's input), and the
  // gradient flowing backward (what layer_backward reads and leaves, embed_backward reads and the head leaves).
  void load_layer_input(int64_t i, const void* src);
  void store_layer_input(int64_t i, void* dst);
  void load_grad(const void* src);
  void store_grad(void* dst);

  // Scratch of a whole unit for dtype staging: `numel` act elements / f32 elements (kept, grown on demand). Slot 0
  // or 1: two units staged at once (the head and, with tied embeddings, the embedding inside its scope).
  static constexpr int kStagingSlots = 2;
  void* param_staging(int64_t numel, int slot = 0);
  float* grad_staging(int64_t numel, int slot = 0);

  // Bytes of backend memory the runner holds now, and the most it has held.
  int64_t allocated_bytes() const { return allocated_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_; }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  struct Cache {
    Buffer rstd1, qkv, lse, attn, h, rstd2, gu;
    BatchShape shape{};
    bool valid = false;
  };

  void* ensure(Buffer& b, int64_t elements, size_t element_bytes);
  void release(Buffer& b);
  void release(Cache& c);
  void size_cache(Cache& c);
  char* act_at(void* base, int64_t elements) const;
  const char* act_at(const void* base, int64_t elements) const;
  void* layer_input(int64_t i) const;
  Cache& cache_of(int64_t layer);
  void check_layer(int64_t layer, const char* what) const;
  void check_boundary(int64_t layer_input, const char* what) const;
  void check_ends(bool embedding, const char* what) const;
  size_t boundary_bytes() const;

  void linear_forward(const void* x, int64_t ldx, const void* w, void* y, int64_t ldy, int64_t in, int64_t out);
  void linear_backward(const void* x, int64_t ldx, const void* w, const void* dy, int64_t lddy, void* dx, int64_t lddx,
                       float* dw, int64_t in, int64_t out, bool accumulate_dx);
  void forward_into(const void* w, const void* x, void* y, Cache& cache);
  // The head with its backward into g, or (g null) the loss only.
  LossResult head(const void* w, float* g, const void* embed_w, float* embed_g, const LossOptions& opt,
                  const char* what);

  ModelConfig config_;
  ModelOps& ops_;
  int64_t offsets_[kLayerParamCount] = {};  // elements into a layer unit
  int64_t head_lm_offset_ = 0;              // lm_head.weight in the head unit (untied)
  float eps_ = 0;

  BatchShape shape_{};
  bool checkpointing_ = true;
  bool batch_ready_ = false;
  int64_t first_layer_ = 0, end_layer_ = 0;  // set_layer_range; end_layer_ = L unless set
  bool loss_deferred_ = false;  // deferred loss sums wait in the backend's accumulator
  std::vector<int32_t> host_ids_, host_targets_;
  BatchShape rope_shape_{};

  Buffer ids_, targets_, cos_, sin_;
  Buffer resid_;  // (L+1) x (tokens, hidden)
  std::vector<Cache> caches_;
  Buffer xn_, mlp_act_, y_, dh_, dwide_, dmid_;  // workspace
  Buffer dx_, head_rstd_;
  Buffer param_staging_[kStagingSlots], grad_staging_[kStagingSlots];

  int64_t allocated_ = 0, peak_allocated_ = 0;
};

}  // namespace llama3

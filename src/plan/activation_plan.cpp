#include "zero3/activation_plan.hpp"

#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3 {
namespace {

// The dimensions with their defaults filled in (kv heads, head_dim), checked as llama_model_desc() checks them.
struct Dims {
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab;
  bool tied;
  int64_t q() const { return heads * head_dim; }
  int64_t kv() const { return kv_heads * head_dim; }
  int64_t qkv() const { return q() + 2 * kv(); }
};

Dims dims_of(const LlamaDims& d) {
  (void)llama_model_desc(d);  // throws InvalidArgument for what it cannot build
  Dims r{d.hidden_size,
         d.intermediate_size,
         d.num_hidden_layers,
         d.num_attention_heads,
         d.num_key_value_heads > 0 ? d.num_key_value_heads : d.num_attention_heads,
         d.head_dim > 0 ? d.head_dim : d.hidden_size / d.num_attention_heads,
         d.vocab_size,
         d.tie_word_embeddings};
  return r;
}

constexpr int64_t kAlign = 256;  // the LM head workspace's alignment of the act copy after the f32 logits

void check_arg(bool ok, const char* what, int64_t value, const char* expected) {
  ZERO3_REQUIRE(ok, InvalidArgument, "plan_lm_head_chunks: ", what, " = ", value, " must be ", expected);
}

}  // namespace

LlamaRunnerBuffers llama_runner_buffers(const LlamaDims& dims, int64_t micro_batch, int64_t seq_len, bool checkpointing,
                                        int64_t act_bytes) {
  ZERO3_REQUIRE(micro_batch >= 1 && seq_len >= 1, InvalidArgument, "llama_runner_buffers: micro_batch ", micro_batch,
                " and seq_len ", seq_len, " must be at least 1");
  const Dims c = dims_of(dims);
  const int64_t n = micro_batch * seq_len;
  // Per layer cache: qkv, attention output, h, gate/up in act; rstd1, rstd2 and the log-sum-exp in f32.
  const int64_t cache_act = n * (c.qkv() + c.q() + c.hidden + 2 * c.inter);
  const int64_t cache_f32 = 2 * n + micro_batch * c.heads * seq_len;
  // xn, y, dh, dx (n, hidden); the MLP activation (n, inter); dwide (n, max(2 inter, qkv)); dmid (n, max(inter, q)).
  const int64_t workspace_act =
      n * (4 * c.hidden + c.inter + std::max(2 * c.inter, c.qkv()) + std::max(c.inter, c.q()));
  LlamaRunnerBuffers r;
  r.layer_inputs = (c.layers + 1) * n * c.hidden * act_bytes;
  r.caches = (checkpointing ? 1 : c.layers) * (cache_act * act_bytes + cache_f32 * 4);
  r.workspace = workspace_act * act_bytes + n * 4;     // + the head's 1/rms (f32)
  r.batch = 2 * n * 4 + 2 * n * (c.head_dim / 2) * 4;  // ids, targets; rope cos, sin
  return r;
}

LmHeadChunkPlan plan_lm_head_chunks(int64_t rows, int64_t hidden, int64_t vocab, int64_t act_bytes, bool backward,
                                    bool weight_grad, int64_t workspace_cap, int64_t chunk_rows) {
  check_arg(rows >= 0, "rows", rows, ">= 0");
  check_arg(hidden > 0, "hidden", hidden, "> 0");
  check_arg(vocab > 0, "vocab", vocab, "> 0");
  check_arg(act_bytes == 2 || act_bytes == 4, "act_bytes", act_bytes, "2 (bf16) or 4 (f32)");
  check_arg(chunk_rows > 0 || workspace_cap > 0, "workspace_cap", workspace_cap, "> 0 when chunk_rows is not given");
  LmHeadChunkPlan p;
  if (rows == 0) return p;
  // The act copy of dlogits exists only with backward and a 16-bit act (cross_entropy.cu).
  const int64_t copy_bytes = backward && act_bytes != 4 ? act_bytes : 0;
  int64_t per_chunk = chunk_rows;
  if (per_chunk <= 0) {
    const int64_t most = std::max<int64_t>(1, workspace_cap / (vocab * (4 + copy_bytes)));
    const int64_t chunks = (rows + most - 1) / most;
    per_chunk = (rows + chunks - 1) / chunks;  // the same number of chunks, as even as they go
  }
  p.rows_per_chunk = std::min(per_chunk, rows);
  p.chunks = (rows + p.rows_per_chunk - 1) / p.rows_per_chunk;
  p.workspace_bytes =
      (p.rows_per_chunk * vocab * 4 + kAlign - 1) / kAlign * kAlign + p.rows_per_chunk * vocab * copy_bytes;
  p.weight_grad_bytes = backward && weight_grad ? p.chunks * 8 * vocab * hidden : 0;
  return p;
}

int64_t default_loss_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{16} << 20) / vocab); }

ActivationEstimate estimate_activations(const LlamaDims& dims, const ActivationOptions& o) {
  ZERO3_REQUIRE(o.micro_batch >= 1 && o.seq_len >= 1, InvalidArgument, "estimate_activations: micro_batch ",
                o.micro_batch, " and seq_len ", o.seq_len, " must be at least 1");
  const Dims c = dims_of(dims);
  const DType act = o.on_gpu ? o.compute : DType::f32;
  const int64_t act_bytes = static_cast<int64_t>(dtype_size(act)), n = o.micro_batch * o.seq_len;
  const LlamaRunnerBuffers runner = llama_runner_buffers(dims, o.micro_batch, o.seq_len, o.checkpointing, act_bytes);
  ActivationEstimate e;
  e.layer_inputs = runner.layer_inputs;
  e.layer_caches = runner.caches;
  e.workspace = runner.workspace + runner.batch;
  const int64_t scores = o.seq_len * o.seq_len;
  if (o.on_gpu) {
    // cuda/attention.cu's backward plan (the larger one): per kv head of a chunk, f32 scores and dP, with bf16
    // their 16-bit copies, chunks of kv heads up to 1 GiB; with bf16 two f32 (seq, kv_dim) accumulators.
    const bool copies = act != DType::f32;
    const int64_t per_head = scores * (8 + (copies ? 4 : 0));
    const int64_t heads = std::clamp<int64_t>((int64_t{1} << 30) / std::max<int64_t>(per_head, 1), 1, c.kv_heads);
    e.attention = heads * per_head + (copies ? 2 * o.seq_len * c.kv() * 4 : 0);
    e.loss_chunk = plan_lm_head_chunks(n, c.hidden, c.vocab, act_bytes, true, true).workspace_bytes;
    // Row losses; the embedding grouping: at most n rows, n + 1 offsets and n token ids.
    e.workspace += n * 4 + (3 * n + 1) * 4;
  } else {
    e.attention = 2 * scores * 4;  // P and dP of one head (ops/attention.cpp)
    const int64_t chunk = std::min(n, default_loss_chunk_rows(c.vocab));
    e.loss_chunk = chunk * (c.vocab + 1) * 4;  // logits and row losses (ops/cross_entropy.cpp)
  }
  // The runner's staging slots, grown to the largest unit each has held; tied embeddings: the head's scope stages
  // the embedding in a second slot.
  const ModelDesc units = llama_model_desc(dims);
  int64_t staged = 0;
  for (const UnitDesc& u : units.units) staged = std::max(staged, u.numel());
  if (c.tied) staged += units.units.front().numel();
  if (o.compute != act) e.unit_staging += staged * act_bytes;
  if (o.grad_accum != DType::f32) e.unit_staging += staged * 4;
  return e;
}

}  // namespace zero3

// The activation memory of one rank's micro-batch of a Llama, as the Llama-3 example's kernels hold it
// (examples/llama3: ModelRunner's buffers, the attention and LM-head scratch of the CUDA ops, the CPU ops'), from the
// model's dimensions and the job's shape alone. One estimate for every reader: `llama3_train --dry-run` prints it,
// `zero3 plan` and `zero3 plan --advise` count it in every memory plan (MemoryPlanOptions::activation_bytes), and the
// example's runner allocates exactly llama_runner_buffers() (its test checks the bytes it holds against it).
//
// Per micro-batch of n = micro_batch x seq_len tokens, with a = the activation element's bytes (the compute dtype on
// a GPU; fp32 on the CPU, 16-bit units widened):
//   layer_inputs  (L + 1) x n x hidden x a: the residual stream between units, kept for backward
//   layer_caches  what a layer's backward reads from its forward: qkv, attention output, h, gate/up (a bytes each)
//                 and rstd1, rstd2, the softmax's log-sum-exp (fp32); for every layer without activation
//                 checkpointing, for one layer (recomputed in backward) with it
//   workspace     xn, y, dh, dx (n x hidden), the MLP activation, the widest and the middle backward scratch, the
//                 head's 1/rms, the batch's ids and targets, the rope tables; on a GPU also the row losses and the
//                 embedding backward's grouping
//   attention     the score scratch: on a GPU, per kv head f32 scores and dP (with their 16-bit copies), in chunks
//                 of kv heads up to 1 GiB, plus two fp32 (seq, kv_dim) accumulators with 16-bit activations; on the
//                 CPU P and dP of one head
//   loss_chunk    one chunk of logits of the chunked cross-entropy (plan_lm_head_chunks() on a GPU,
//                 default_loss_chunk_rows() on the CPU)
//   unit_staging  the largest unit converted to the activation dtype when the compute dtype differs from it, and its
//                 fp32 gradients with a 16-bit gradient accumulator; tied embeddings: plus the embedding unit
#pragma once

#include <cstdint>

#include "zero3/dtype.hpp"

namespace zero3 {

struct LlamaDims;  // zero3/memory_plan.hpp (this header stays light: the example's CUDA sources include it)

struct ActivationOptions {
  int64_t micro_batch = 1;        // sequences per micro-batch (train_micro_batch_size_per_gpu), >= 1
  int64_t seq_len = 1;            // tokens per sequence, >= 1
  bool checkpointing = true;      // activation checkpointing per layer (llama3_train --grad-checkpointing, its default)
  bool on_gpu = true;             // the CUDA kernels; false: the CPU ops (zero3.device "cpu")
  DType compute = DType::bf16;    // the config's compute dtype
  DType grad_accum = DType::f32;  // data_types.grad_accum_dtype
};

// ModelRunner's buffers for one shape, in bytes (act_bytes per activation element).
struct LlamaRunnerBuffers {
  int64_t layer_inputs = 0;  // (L+1) residual streams
  int64_t caches = 0;        // one or L layer caches
  int64_t workspace = 0;     // layer workspace, dx, head rstd
  int64_t batch = 0;         // ids, targets, rope tables
  int64_t total() const { return layer_inputs + caches + workspace + batch; }
};
LlamaRunnerBuffers llama_runner_buffers(const LlamaDims& dims, int64_t micro_batch, int64_t seq_len, bool checkpointing,
                                        int64_t act_bytes);

// How the GPU's LM head + cross-entropy splits a micro-batch into chunks of rows, and what that costs (the example's
// backend/lm_head_plan.hpp explains the trade). Per chunk: its logits in f32 (256-byte aligned) plus their 16-bit
// copy with backward and a 16-bit act; the largest chunk whose workspace fits `workspace_cap`, rows evened out.
inline constexpr int64_t kDefaultLmHeadWorkspaceCap = int64_t{1} << 30;
struct LmHeadChunkPlan {
  int64_t rows_per_chunk = 0;   // rows of logits at a time (the last chunk may have fewer)
  int64_t chunks = 0;           // ceil(rows / rows_per_chunk)
  int64_t workspace_bytes = 0;  // the logits of one chunk in f32 (256-byte aligned), plus their act copy with bf16
  // Bytes read and written through the f32 weight gradient per micro-batch: chunks * 8 * vocab * hidden with
  // backward and dW, else 0.
  int64_t weight_grad_bytes = 0;
};
// rows: tokens of the micro-batch (>= 0); hidden, vocab > 0; act_bytes: 4 (f32) or 2 (bf16); backward: dx is
// computed (with bf16 the dlogits get an act copy); weight_grad: dW is accumulated. chunk_rows > 0 forces that
// many rows per chunk (tests; the CPU-sized chunk); <= 0 plans from workspace_cap (> 0). Throws InvalidArgument
// naming the argument for anything else.
LmHeadChunkPlan plan_lm_head_chunks(int64_t rows, int64_t hidden, int64_t vocab, int64_t act_bytes, bool backward,
                                    bool weight_grad, int64_t workspace_cap = kDefaultLmHeadWorkspaceCap,
                                    int64_t chunk_rows = 0);

// The CPU cross-entropy's rows of logits at a time: 16 Mi logits, at least one row.
int64_t default_loss_chunk_rows(int64_t vocab);

// One rank's activations during a micro-batch, by part (the header's list).
struct ActivationEstimate {
  int64_t layer_inputs = 0;
  int64_t layer_caches = 0;
  int64_t workspace = 0;
  int64_t attention = 0;
  int64_t loss_chunk = 0;
  int64_t unit_staging = 0;
  int64_t total() const { return layer_inputs + layer_caches + workspace + attention + loss_chunk + unit_staging; }
};

// Throws InvalidArgument naming the field: a micro_batch or seq_len below 1, dimensions llama_model_desc() refuses
// (a zero or negative one, heads that do not divide).
ActivationEstimate estimate_activations(const LlamaDims& dims, const ActivationOptions& options);

}  // namespace zero3

// How the GPU's LM head + cross-entropy (cuda_ops.hpp LmHeadLoss) splits a micro-batch into chunks of rows, and
// what that costs: pure arithmetic, the same on every machine, so the bound is tested on the CPU
// (tests/test_lm_head_plan.cpp) and the CUDA op follows the plan it returns (tests/gpu/test_cuda_ops.cpp checks
// its counter against it).
//
// Per chunk of rows the op computes the chunk's logits (rows, vocab) in f32 (plus their act copy with bf16, the
// GEMMs' input), turns them into the loss and dlogits, then dx_chunk = dlogits W and dW += dlogits^T x_chunk. That
// last GEMM accumulates into the f32 (vocab, hidden) weight gradient: it reads and writes all of it once per chunk,
// 8 * vocab * hidden bytes (2.1 GB read and 2.1 GB written for Llama-3-8B). So the bytes moved through dW per
// micro-batch are chunks * 8 * vocab * hidden: the fewer, larger chunks the better, up to the memory the logits
// may take. The plan takes the largest chunk whose workspace fits `workspace_cap` (at least one row), then evens
// the rows out over the chunks that needs. The CPU op keeps its own small chunk (default_loss_chunk_rows), sized
// for a core's caches.
//
// Worked for Llama-3-8B (vocab 128,256, hidden 4096), 8192 tokens, bf16, the default 1 GiB cap: 769,536 bytes of
// workspace per row, at most 1395 rows, 6 chunks of 1366 rows; 6 passes over dW, 25.2 GB per micro-batch (the
// CPU's 130-row chunk made it 64 passes, 269 GB). Each dW GEMM then does 2 * vocab * hidden * 1366 FLOPs for its
// 8 * vocab * hidden bytes of dW: 341 FLOPs per byte, above an H100's ratio of peak bf16 FLOP/s to memory bandwidth
// (989e12 / 3.35e12 = 295), so the traffic is under the GEMM's arithmetic rather than in front of it.
#pragma once

#include "zero3/activation_plan.hpp"

namespace llama3 {

// The plan itself is zero3's (zero3/activation_plan.hpp), so that `zero3 plan` counts the same workspace: rows
// (>= 0), hidden, vocab (> 0), act_bytes 2 or 4, backward, weight_grad, then an optional workspace cap and a forced
// chunk of rows.
using zero3::kDefaultLmHeadWorkspaceCap;
using zero3::LmHeadChunkPlan;
using zero3::plan_lm_head_chunks;

}  // namespace llama3

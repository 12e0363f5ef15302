#include "backend/lm_head_plan.hpp"

#include <algorithm>
#include <string>

#include "zero3/error.hpp"

namespace llama3 {
namespace {

constexpr int64_t kAlign = 256;  // the workspace's alignment of the act copy after the f32 logits

int64_t align_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

void check(bool ok, const char* what, int64_t value, const char* expected) {
  if (!ok) {
    throw zero3::InvalidArgument(std::string("plan_lm_head_chunks: ") + what + " = " + std::to_string(value) +
                                 " must be " + expected);
  }
}

}  // namespace

LmHeadChunkPlan plan_lm_head_chunks(int64_t rows, int64_t hidden, int64_t vocab, int64_t act_bytes, bool backward,
                                    bool weight_grad, int64_t workspace_cap, int64_t chunk_rows) {
  check(rows >= 0, "rows", rows, ">= 0");
  check(hidden > 0, "hidden", hidden, "> 0");
  check(vocab > 0, "vocab", vocab, "> 0");
  check(act_bytes == 2 || act_bytes == 4, "act_bytes", act_bytes, "2 (bf16) or 4 (f32)");
  check(chunk_rows > 0 || workspace_cap > 0, "workspace_cap", workspace_cap, "> 0 when chunk_rows is not given");
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
  p.workspace_bytes = align_up(p.rows_per_chunk * vocab * 4) + p.rows_per_chunk * vocab * copy_bytes;
  p.weight_grad_bytes = backward && weight_grad ? p.chunks * 8 * vocab * hidden : 0;
  return p;
}

}  // namespace llama3

// The GPU LM head's chunk plan (backend/lm_head_plan.hpp), which cuda/cross_entropy.cu follows: the bytes it moves
// through its f32 weight gradient per micro-batch, bounded for Llama-3-8B's shapes (vocab 128,256, hidden 4096,
// 8192 tokens) against values worked by hand, the workspace within its cap whatever the micro-batch, and the
// logits of the whole micro-batch never held when they do not fit. tests/gpu/test_cuda_ops.cpp checks that the
// CUDA op's own counter moves exactly the plan's bytes.
#include <gtest/gtest.h>

#include "backend/lm_head_plan.hpp"
#include "ops/cross_entropy.hpp"
#include "zero3/error.hpp"

using namespace llama3;

namespace {

constexpr int64_t kVocab = 128256, kHidden = 4096, kTokens = 8192;
constexpr int64_t kWeightGradPass = 8 * kVocab * kHidden;  // dW (f32) read and written once: 4,202,692,608 bytes

}  // namespace

TEST(LmHeadPlan, Llama3_8BBf16PassesOverTheWeightGradientSixTimes) {
  // Per row: 128,256 f32 logits + their bf16 copy = 769,536 bytes; 1 GiB / 769,536 = 1395 rows; 8192 tokens need
  // ceil(8192 / 1395) = 6 chunks, evened out to ceil(8192 / 6) = 1366 rows.
  const LmHeadChunkPlan p = plan_lm_head_chunks(kTokens, kHidden, kVocab, 2, true, true);
  EXPECT_EQ(p.rows_per_chunk, 1366);
  EXPECT_EQ(p.chunks, 6);
  EXPECT_EQ(p.weight_grad_bytes, 25216155648);  // 6 x 4,202,692,608
  EXPECT_EQ(p.weight_grad_bytes, 6 * kWeightGradPass);
  // 1366 * 128256 * 4 = 700,790,784 (a multiple of 256) + 1366 * 128256 * 2 = 350,395,392
  EXPECT_EQ(p.workspace_bytes, 700790784 + 350395392);
  EXPECT_LE(p.workspace_bytes, kDefaultLmHeadWorkspaceCap);
  // The whole micro-batch's logits (8192 rows) never exist.
  EXPECT_LT(p.rows_per_chunk, kTokens);
  // The dW GEMM of a chunk: 2 * vocab * hidden * rows FLOPs for its 8 * vocab * hidden bytes of dW, at least an
  // H100's peak bf16 FLOP/s per byte of memory bandwidth (989e12 / 3.35e12 = 295): the traffic hides under the math.
  EXPECT_GE(2.0 * static_cast<double>(p.rows_per_chunk) / 8.0, 989e12 / 3.35e12);
}

TEST(LmHeadPlan, TheCpuSizedChunkWouldPassSixtyFourTimes) {
  // What the GPU ran before: the CPU's 130-row chunk (16 Mi logits): 64 chunks, 269 GB through dW per micro-batch.
  const int64_t cpu_rows = default_loss_chunk_rows(kVocab);
  ASSERT_EQ(cpu_rows, 130);
  const LmHeadChunkPlan p =
      plan_lm_head_chunks(kTokens, kHidden, kVocab, 2, true, true, kDefaultLmHeadWorkspaceCap, cpu_rows);
  EXPECT_EQ(p.chunks, 64);
  EXPECT_EQ(p.weight_grad_bytes, 64 * kWeightGradPass);
  const LmHeadChunkPlan planned = plan_lm_head_chunks(kTokens, kHidden, kVocab, 2, true, true);
  EXPECT_LE(planned.weight_grad_bytes * 10, p.weight_grad_bytes);
}

TEST(LmHeadPlan, F32HasNoCopyAndFewerChunks) {
  // 513,024 bytes per row: 2092 rows fit, 4 chunks of 2048.
  const LmHeadChunkPlan p = plan_lm_head_chunks(kTokens, kHidden, kVocab, 4, true, true);
  EXPECT_EQ(p.rows_per_chunk, 2048);
  EXPECT_EQ(p.chunks, 4);
  EXPECT_EQ(p.weight_grad_bytes, 4 * kWeightGradPass);
  EXPECT_EQ(p.workspace_bytes, 2048 * kVocab * 4);
}

TEST(LmHeadPlan, TheBoundHoldsForEveryMicroBatchAndCap) {
  // bytes through dW = ceil(rows / rows that fit the cap) passes, and the workspace never over the cap (one row
  // at least), for micro-batches from 1 token to 64K and caps from one row's worth to 4 GiB.
  for (int64_t cap : {int64_t{769536}, int64_t{100} << 20, int64_t{1} << 30, int64_t{4} << 30}) {
    const int64_t fit = std::max<int64_t>(1, cap / (kVocab * 6));
    for (int64_t rows :
         {int64_t{1}, int64_t{7}, int64_t{1395}, int64_t{1396}, int64_t{4093}, kTokens, int64_t{65536}}) {
      SCOPED_TRACE("cap " + std::to_string(cap) + " rows " + std::to_string(rows));
      const LmHeadChunkPlan p = plan_lm_head_chunks(rows, kHidden, kVocab, 2, true, true, cap);
      const int64_t passes = (rows + fit - 1) / fit;
      EXPECT_EQ(p.chunks, passes);
      EXPECT_EQ(p.weight_grad_bytes, passes * kWeightGradPass);
      EXPECT_LE(p.workspace_bytes, std::max(cap, int64_t{256} + kVocab * 6));
      EXPECT_GE(p.rows_per_chunk * p.chunks, rows);
      EXPECT_LT((p.rows_per_chunk - 1) * p.chunks, rows) << "chunks not even";
    }
  }
}

TEST(LmHeadPlan, ForwardOnlyAndNoWeightGradient) {
  // Evaluation: no dlogits copy (1 GiB / 513,024 = 2092 rows), nothing through dW.
  const LmHeadChunkPlan eval = plan_lm_head_chunks(kTokens, kHidden, kVocab, 2, false, false);
  EXPECT_EQ(eval.chunks, 4);
  EXPECT_EQ(eval.weight_grad_bytes, 0);
  // dx without dW (a frozen head): no dW traffic either.
  EXPECT_EQ(plan_lm_head_chunks(kTokens, kHidden, kVocab, 2, true, false).weight_grad_bytes, 0);
  EXPECT_EQ(plan_lm_head_chunks(0, kHidden, kVocab, 2, true, true).chunks, 0);
}

TEST(LmHeadPlan, ForcedChunkAndSmallBatches) {
  // A forced chunk is taken as given (capped at the rows); a micro-batch whose logits fit is one pass.
  const LmHeadChunkPlan forced = plan_lm_head_chunks(37, 96, 301, 2, true, true, kDefaultLmHeadWorkspaceCap, 16);
  EXPECT_EQ(forced.rows_per_chunk, 16);
  EXPECT_EQ(forced.chunks, 3);
  EXPECT_EQ(plan_lm_head_chunks(37, 96, 301, 2, true, true, kDefaultLmHeadWorkspaceCap, 1000).rows_per_chunk, 37);
  const LmHeadChunkPlan small = plan_lm_head_chunks(1000, kHidden, kVocab, 2, true, true);
  EXPECT_EQ(small.chunks, 1);
  EXPECT_EQ(small.weight_grad_bytes, kWeightGradPass);
}

TEST(LmHeadPlan, BadArgumentsAreNamed) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const zero3::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { plan_lm_head_chunks(-1, 8, 8, 2, true, true); }).find("rows = -1"), std::string::npos);
  EXPECT_NE(message([] { plan_lm_head_chunks(4, 0, 8, 2, true, true); }).find("hidden = 0"), std::string::npos);
  EXPECT_NE(message([] { plan_lm_head_chunks(4, 8, 8, 3, true, true); }).find("act_bytes = 3"), std::string::npos);
  EXPECT_NE(message([] { plan_lm_head_chunks(4, 8, 8, 2, true, true, 0); }).find("workspace_cap = 0"),
            std::string::npos);
}

// MFU as llama3_train prints it, in PaLM's / torchtitan's convention (6 x the parameters without the input
// embedding + 12 x layers x hidden x seq FLOPs per token): Llama-3-8B, the bench's 1.5B model and Llama-3.2-1B
// (tied) against the counts worked by hand, the peaks by device name, and n/a for a device without a known peak.
#include <gtest/gtest.h>

#include <string>

#include "mfu.hpp"
#include "model_config.hpp"

using namespace llama3;

namespace {

ModelConfig config_from(const std::string& file) {
  return load_model_config(std::string(LLAMA3_SOURCE_DIR) + "/../../configs/models/" + file);
}

}  // namespace

TEST(Mfu, FlopsPerTokenOfLlama3_8BWithoutTheEmbedding) {
  const ModelConfig c = config_from("llama-3-8b.json");
  ASSERT_EQ(c.num_parameters(), 8030261248);
  // Less the input embedding, 128,256 x 4096 = 525,336,576: 7,504,924,672 (the LM head stays: it is a GEMM).
  EXPECT_EQ(flop_parameters(c), 7504924672);
  // 6 * 7,504,924,672 + 12 * 32 * 4096 * 8192 = 45,029,548,032 + 12,884,901,888
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 8192), 57914449920.0);
  // 1000 tokens/s per GPU on an H100 SXM: 5.7914e13 / 9.89e14
  auto mfu = model_flops_utilization(c, 8192, 1000.0, peak_bf16_flops("NVIDIA H100 80GB HBM3"));
  ASSERT_TRUE(mfu.has_value());
  EXPECT_NEAR(*mfu, 57914449920.0 * 1000.0 / 989e12, 1e-12);
}

TEST(Mfu, FlopsPerTokenOfTheBenchModel) {
  // configs/models/llama-3-1b-untied.json (scripts/gpu-run.sh): hidden 2048, ffn 8192, 16 layers, 32 heads
  // on 8 kv heads (head_dim 64), vocabulary 128,256, untied. Per layer 2048 * (2048 + 512 + 512 + 2048) +
  // 3 * 2048 * 8192 + 2 * 2048 = 60,821,504; 16 layers 973,144,064; embedding and head 262,668,288 each; final norm
  // 2048: 1,498,482,688 parameters, 1,235,814,400 without the embedding.
  const ModelConfig c = config_from("llama-3-1b-untied.json");
  ASSERT_EQ(c.num_parameters(), 1498482688);
  EXPECT_EQ(flop_parameters(c), 1235814400);
  // seq 1024: 6 * 1,235,814,400 + 12 * 16 * 2048 * 1024 = 7,414,886,400 + 402,653,184
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 1024), 7817539584.0);
  // seq 4096: 7,414,886,400 + 1,610,612,736
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 4096), 9025499136.0);
}

TEST(Mfu, ATiedModelCountsItsOneMatrixAsTheHead) {
  // Llama-3.2-1B: the same shapes as the bench model with the head tied to the embedding: 1,235,814,400
  // parameters, every one of them counted (the shared matrix once, as the LM head's GEMM).
  const ModelConfig c = config_from("llama-3.2-1b.json");
  ASSERT_TRUE(c.tie_word_embeddings);
  ASSERT_EQ(c.num_parameters(), 1235814400);
  EXPECT_EQ(flop_parameters(c), 1235814400);
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 1024), 7817539584.0);
}

TEST(Mfu, PeaksByDeviceName) {
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 SXM5 80GB"), 989e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA A100 80GB PCIe"), 312e12);
  // Other peaks than the SXM part: no figure rather than a wrong one.
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_FALSE(peak_bf16_flops("NVIDIA GeForce RTX 4090").has_value());
  EXPECT_FALSE(peak_bf16_flops("cpu").has_value());
  ModelConfig c;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  EXPECT_FALSE(model_flops_utilization(c, 128, 1e6, std::nullopt).has_value());
}

// MFU as llama3_train prints it: the FLOPs count of Llama-3-8B per token at seq 8192 against PaLM's formula
// worked by hand, the peaks by device name, and n/a for a device without a known peak.
#include <gtest/gtest.h>

#include "mfu.hpp"
#include "model_config.hpp"

using namespace llama3;

TEST(Mfu, FlopsPerTokenOfLlama3_8B) {
  ModelConfig c;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  ASSERT_EQ(c.num_parameters(), 8030261248);
  // 6 * 8,030,261,248 + 12 * 32 * 4096 * 8192 = 48,181,567,488 + 12,884,901,888
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 8192), 61066469376.0);
  // 1000 tokens/s per GPU on an H100 SXM: 6.1066e13 / 9.89e14
  auto mfu = model_flops_utilization(c, 8192, 1000.0, peak_bf16_flops("NVIDIA H100 80GB HBM3"));
  ASSERT_TRUE(mfu.has_value());
  EXPECT_NEAR(*mfu, 61066469376.0 * 1000.0 / 989e12, 1e-12);
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

#include "mfu.hpp"

namespace llama3 {

int64_t flop_parameters(const ModelConfig& c) {
  return c.num_parameters() - (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size);
}

double model_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  return 6.0 * static_cast<double>(flop_parameters(c)) + 12.0 * static_cast<double>(c.num_hidden_layers) *
                                                             static_cast<double>(c.hidden_size) *
                                                             static_cast<double>(seq_len);
}

std::optional<double> peak_bf16_flops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return 989e12;
  // The SXM H100 reports its memory type ("NVIDIA H100 80GB HBM3"); PCIe and NVL boards have lower peaks.
  if (has("H100") && has("PCIe")) return 756e12;
  if (has("H100") && has("NVL")) return 835e12;
  if (has("H100")) return 989e12;
  if (has("L40S")) return 362e12;
  if (has("A100")) return 312e12;
  return std::nullopt;
}

std::optional<double> model_flops_utilization(const ModelConfig& c, int64_t seq_len, double tokens_per_s_per_gpu,
                                              std::optional<double> peak_flops) {
  if (!peak_flops || *peak_flops <= 0) return std::nullopt;
  return model_flops_per_token(c, seq_len) * tokens_per_s_per_gpu / *peak_flops;
}

}  // namespace llama3

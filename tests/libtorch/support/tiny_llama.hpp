// The libtorch adapter's test model: a small Llama-style decoder written with torch::nn. The model itself holds
// a learned position table `pos` and the final RMSNorm `norm` (the root unit's parameters); `tok_emb` (Embedding),
// `blocks.<i>` (RMSNorm, causal self-attention, RMSNorm, SwiGLU MLP) and `head` are the submodules the tests make
// units. With `tie`, the head multiplies by the embedding's own weight (registered under both modules, so it
// belongs to the root) after a gain of its own on the features.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace zero3::testing {

struct TinyLlamaConfig {
  int64_t vocab = 53;
  int64_t dim = 24;
  int64_t heads = 2;
  int64_t layers = 3;
  int64_t ffn = 40;
  int64_t seq = 8;
  bool tie = false;
  double attn_dropout = 0.0;
};

// Built and initialized by torch after torch::manual_seed(seed): the same seed gives the same weights.
std::shared_ptr<torch::nn::Module> make_tiny_llama(const TinyLlamaConfig& config, uint64_t seed);

// Logits [B, T, vocab] for token ids [B, T]; the model and its units are called through zero3::libtorch::call.
at::Tensor tiny_llama_logits(const std::shared_ptr<torch::nn::Module>& model, const at::Tensor& ids);

// The submodule paths the tests make units: "tok_emb", "blocks.0", ..., "head".
std::vector<std::string> tiny_llama_units(const TinyLlamaConfig& config);

// Called when a block's forward starts and when backward reaches the block's output (inside its backward).
using BlockObserver = std::function<void(int layer, bool backward)>;
void set_block_observer(BlockObserver observer);

}  // namespace zero3::testing

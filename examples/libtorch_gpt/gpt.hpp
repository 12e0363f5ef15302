// A GPT written with torch::nn, as a libtorch user writes one: token and position embeddings, pre-norm blocks of
// causal self-attention and a GELU MLP, a final LayerNorm and a linear head. The one zero3-specific line is in
// GptImpl::forward: the embedding, each block and the head are called through zero3::libtorch::call(), which is
// an ordinary forward call when the model is not wrapped by a ShardedModel.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

struct GptConfig {
  int64_t vocab = 256;      // bytes
  int64_t block_size = 64;  // the longest sequence (position table)
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t layers = 4;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x);
  int64_t heads;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c);
  // Logits [B, T, vocab] for byte ids [B, T].
  at::Tensor forward(const at::Tensor& ids);
  // The submodules that are zero3 units: "wte", "blocks.0", ..., "head". The rest (wpe, ln_f) is the root unit.
  std::vector<std::string> unit_paths() const;

  GptConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

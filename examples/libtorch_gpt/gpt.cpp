#include "gpt.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include <zero3/libtorch.hpp>

namespace F = torch::nn::functional;

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c) : heads(c.heads) {
  qkv = register_module("qkv", torch::nn::Linear(c.dim, 3 * c.dim));
  proj = register_module("proj", torch::nn::Linear(c.dim, c.dim));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), Dh = C / heads;
  std::vector<at::Tensor> q_k_v = qkv(x).view({B, T, 3, heads, Dh}).permute({2, 0, 3, 1, 4}).unbind(0);
  at::Tensor att = torch::matmul(q_k_v[0], q_k_v[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
  at::Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  return proj(torch::matmul(att, q_k_v[2]).transpose(1, 2).reshape({B, T, C}));
}

MlpImpl::MlpImpl(const GptConfig& c) {
  fc = register_module("fc", torch::nn::Linear(c.dim, 4 * c.dim));
  proj = register_module("proj", torch::nn::Linear(4 * c.dim, c.dim));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) { return proj(F::gelu(fc(x))); }

BlockImpl::BlockImpl(const GptConfig& c) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  mlp = register_module("mlp", Mlp(c));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

GptImpl::GptImpl(const GptConfig& c) : config(c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.dim));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.dim));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab).bias(false)));
  // GPT-2's initialization: N(0, 0.02) weights, zero biases.
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      item.value().zero_();
    } else if (item.value().dim() == 2) {
      item.value().normal_(0.0, 0.02);
    }
  }
}

at::Tensor GptImpl::forward(const at::Tensor& ids) {
  const int64_t T = ids.size(1);
  at::Tensor x = zero3::libtorch::call(wte, ids) + wpe(torch::arange(T, ids.options()));
  for (const auto& block : *blocks) x = zero3::libtorch::call(block->as<BlockImpl>(), x);
  return zero3::libtorch::call(head, ln_f(x));
}

std::vector<std::string> GptImpl::unit_paths() const {
  std::vector<std::string> paths{"wte"};
  for (int64_t i = 0; i < config.layers; ++i) paths.push_back("blocks." + std::to_string(i));
  paths.push_back("head");
  return paths;
}

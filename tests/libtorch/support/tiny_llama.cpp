#include "tiny_llama.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include "zero3/libtorch.hpp"

namespace zero3::testing {
namespace {

namespace F = torch::nn::functional;

BlockObserver& observer() {
  static BlockObserver o;
  return o;
}

struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t dim) { weight = register_parameter("weight", torch::ones({dim})); }
  at::Tensor forward(const at::Tensor& x) { return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * weight; }
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const TinyLlamaConfig& c, int layer) : config(c), layer(layer) {
    attn_norm = register_module("attn_norm", RMSNorm(c.dim));
    wqkv = register_module("wqkv", torch::nn::Linear(torch::nn::LinearOptions(c.dim, 3 * c.dim).bias(false)));
    wo = register_module("wo", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.dim).bias(false)));
    mlp_norm = register_module("mlp_norm", RMSNorm(c.dim));
    w_gate_up = register_module("w_gate_up", torch::nn::Linear(torch::nn::LinearOptions(c.dim, 2 * c.ffn).bias(false)));
    w_down = register_module("w_down", torch::nn::Linear(torch::nn::LinearOptions(c.ffn, c.dim).bias(false)));
  }

  at::Tensor forward(const at::Tensor& x) {
    if (observer()) observer()(layer, false);
    const int64_t B = x.size(0), T = x.size(1), H = config.heads, Dh = config.dim / config.heads;
    at::Tensor qkv = wqkv(attn_norm(x)).view({B, T, 3, H, Dh}).permute({2, 0, 3, 1, 4});
    at::Tensor att = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
    at::Tensor causal = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
    att = torch::softmax(att.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1);
    att = F::dropout(att, F::DropoutFuncOptions().p(config.attn_dropout).training(is_training()));
    at::Tensor y = torch::matmul(att, qkv[2]).transpose(1, 2).reshape({B, T, config.dim});
    at::Tensor h = x + wo(y);
    std::vector<at::Tensor> gate_up = w_gate_up(mlp_norm(h)).chunk(2, -1);
    at::Tensor out = h + w_down(F::silu(gate_up[0]) * gate_up[1]);
    if (out.requires_grad()) {
      out.register_hook([l = layer](const at::Tensor&) {
        if (observer()) observer()(l, true);
      });
    }
    return out;
  }

  TinyLlamaConfig config;
  int layer;
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  torch::nn::Linear wqkv{nullptr}, wo{nullptr}, w_gate_up{nullptr}, w_down{nullptr};
};
TORCH_MODULE(Block);

// The head of a tied model: the embedding's weight, registered here too, and a gain of its own on the features.
struct TiedHeadImpl : torch::nn::Module {
  TiedHeadImpl(const at::Tensor& embedding, int64_t dim) {
    weight = register_parameter("weight", embedding);
    gain = register_parameter("gain", torch::ones({dim}));
  }
  at::Tensor forward(const at::Tensor& x) { return F::linear(x * gain, weight); }
  at::Tensor weight, gain;
};
TORCH_MODULE(TiedHead);

struct TinyLlamaImpl : torch::nn::Module {
  explicit TinyLlamaImpl(const TinyLlamaConfig& c) : config(c) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.dim));
    pos = register_parameter("pos", torch::randn({c.seq, c.dim}) * 0.02);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < c.layers; ++i) blocks->push_back(Block(c, i));
    norm = register_module("norm", RMSNorm(c.dim));
    if (c.tie) {
      tied_head = register_module("head", TiedHead(tok_emb->weight, c.dim));
    } else {
      head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab).bias(false)));
    }
  }

  at::Tensor forward(const at::Tensor& ids) {
    const int64_t T = ids.size(1);
    at::Tensor x = zero3::libtorch::call(tok_emb, ids) + pos.slice(0, 0, T);
    for (const auto& block : *blocks) x = zero3::libtorch::call(block->as<BlockImpl>(), x);
    x = norm(x);
    return config.tie ? zero3::libtorch::call(tied_head, x) : zero3::libtorch::call(head, x);
  }

  TinyLlamaConfig config;
  torch::nn::Embedding tok_emb{nullptr};
  at::Tensor pos;
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
  TiedHead tied_head{nullptr};
};

}  // namespace

std::shared_ptr<torch::nn::Module> make_tiny_llama(const TinyLlamaConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<TinyLlamaImpl>(config);
}

at::Tensor tiny_llama_logits(const std::shared_ptr<torch::nn::Module>& model, const at::Tensor& ids) {
  auto* llama = dynamic_cast<TinyLlamaImpl*>(model.get());
  if (llama == nullptr) throw std::invalid_argument("tiny_llama_logits: not a model of make_tiny_llama");
  return zero3::libtorch::call(llama, ids);
}

std::vector<std::string> tiny_llama_units(const TinyLlamaConfig& config) {
  std::vector<std::string> units{"tok_emb"};
  for (int i = 0; i < config.layers; ++i) units.push_back("blocks." + std::to_string(i));
  units.push_back("head");
  return units;
}

void set_block_observer(BlockObserver o) { observer() = std::move(o); }

}  // namespace zero3::testing

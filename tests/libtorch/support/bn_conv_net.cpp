#include "support/bn_conv_net.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <stdexcept>

#include "zero3/libtorch.hpp"
#include "zero3/libtorch/sync_batch_norm.hpp"

namespace zero3::testing {
namespace {

torch::nn::AnyModule make_norm(const BnConvNetConfig& c, int64_t features, int image_dims) {
  // libtorch 1.13's option is a c10::optional, not a std::optional.
  const auto options = torch::nn::BatchNormOptions(features).momentum(
      c.momentum ? c10::optional<double>(*c.momentum) : c10::optional<double>());
  if (c.sync_batch_norm) return torch::nn::AnyModule(zero3::libtorch::SyncBatchNorm(options));
  if (image_dims == 2) return torch::nn::AnyModule(torch::nn::BatchNorm2d(options));
  return torch::nn::AnyModule(torch::nn::BatchNorm1d(options));
}

struct ConvBlockImpl : torch::nn::Module {
  ConvBlockImpl(const BnConvNetConfig& c, int64_t in) {
    conv =
        register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, c.channels, 3).padding(1).bias(false)));
    norm = make_norm(c, c.channels, 2);
    register_module("bn", norm.ptr());
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(norm.forward(conv(x))); }

  torch::nn::Conv2d conv{nullptr};
  torch::nn::AnyModule norm;
};
TORCH_MODULE(ConvBlock);

struct BnConvNetImpl : torch::nn::Module {
  explicit BnConvNetImpl(const BnConvNetConfig& c) {
    block1 = register_module("block1", ConvBlock(c, c.in_channels));
    block2 = register_module("block2", ConvBlock(c, c.channels));
    norm = make_norm(c, c.channels, 1);
    register_module("norm", norm.ptr());
    head = register_module("head", torch::nn::Linear(c.channels, c.classes));
  }
  at::Tensor forward(const at::Tensor& images) {
    at::Tensor x = zero3::libtorch::call(block1, images);
    x = zero3::libtorch::call(block2, x).mean({2, 3});  // (N, C)
    return zero3::libtorch::call(head, norm.forward(x));
  }

  ConvBlock block1{nullptr}, block2{nullptr};
  torch::nn::AnyModule norm;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BnConvNet);

}  // namespace

std::shared_ptr<torch::nn::Module> make_bn_conv_net(const BnConvNetConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  return BnConvNet(config).ptr();
}

at::Tensor bn_conv_net_logits(const std::shared_ptr<torch::nn::Module>& model, const at::Tensor& images) {
  auto* net = dynamic_cast<BnConvNetImpl*>(model.get());
  if (net == nullptr) throw std::invalid_argument("bn_conv_net_logits: not a model of make_bn_conv_net");
  return zero3::libtorch::call(net, images);
}

std::vector<std::string> bn_conv_net_units() { return {"block1", "block2", "head"}; }

std::pair<at::Tensor, at::Tensor> bn_conv_net_batch(const BnConvNetConfig& config, int64_t rows, int64_t step) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
  at::Tensor images = at::randn({rows, config.in_channels, 5, 5}, gen);
  return {images, at::randint(0, config.classes, {rows}, gen)};
}

std::map<std::string, at::Tensor> buffers_on_cpu(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_buffers()) out[item.key()] = item.value().detach().to(at::kCPU).clone();
  return out;
}

BnConvNetRun train_bn_conv_net_plain(const BnConvNetConfig& config, uint64_t seed, const TrainSpec& spec, int64_t rows,
                                     const BatchLoss& loss) {
  std::shared_ptr<torch::nn::Module> model = make_bn_conv_net(config, seed);
  std::vector<at::Tensor> params = model->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weight_decay));
  BnConvNetRun run;
  for (int64_t step = 0; step < spec.steps; ++step) {
    opt.zero_grad();
    auto [images, labels] = bn_conv_net_batch(config, rows, step);
    at::Tensor value = loss(bn_conv_net_logits(model, images), labels);
    value.backward();
    torch::nn::utils::clip_grad_norm_(params, spec.clip);
    opt.step();
    run.losses.push_back(value.item<double>());
  }
  run.params = to_param_map(model->named_parameters());
  run.buffers = buffers_on_cpu(*model);
  return run;
}

}  // namespace zero3::testing

// The CIFAR-10 classifier of DeepSpeed's cifar10_deepspeed.py (PyTorch's CIFAR-10 tutorial network), written with
// torch::nn: two 5x5 convolutions with ReLU and 2x2 max pooling, then three linear layers, 62,006 parameters and no
// buffers. The one zero3-specific change: each layer is called through zero3::libtorch::call(), an ordinary forward
// call when the model is not wrapped by a ShardedModel.
#pragma once

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include <zero3/libtorch.hpp>

struct Cifar10NetImpl : torch::nn::Module {
  Cifar10NetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 5)));
    pool = register_module("pool", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)));
    fc1 = register_module("fc1", torch::nn::Linear(16 * 5 * 5, 120));
    fc2 = register_module("fc2", torch::nn::Linear(120, 84));
    fc3 = register_module("fc3", torch::nn::Linear(84, 10));
  }

  // Logits [B, 10] for images [B, 3, 32, 32].
  at::Tensor forward(const at::Tensor& images) {
    namespace F = torch::nn::functional;
    using zero3::libtorch::call;
    at::Tensor x = pool(F::relu(call(conv1, images)));
    x = pool(F::relu(call(conv2, x)));
    x = F::relu(call(fc1, x.flatten(1)));
    x = F::relu(call(fc2, x));
    return call(fc3, x);
  }

  // The submodules that are zero3 units: every layer with parameters (the root unit has none).
  static std::vector<std::string> unit_paths() { return {"conv1", "conv2", "fc1", "fc2", "fc3"}; }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::MaxPool2d pool{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Cifar10Net);

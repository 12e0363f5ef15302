// ResNet-50 in torchvision's layout (torchvision.models.resnet50), written with torch::nn: the stem (conv1, bn1,
// ReLU, 3x3 max pooling), four stages layer1-layer4 of 3, 4, 6 and 3 Bottleneck blocks (1x1, 3x3 with the stride,
// 1x1 to 4x the width, a downsample.0/.1 projection where the shape changes), global average pooling and fc.
// Module and parameter names, shapes and the initialization (Kaiming normal, fan-out, for the convolutions; BatchNorm
// weight 1 and bias 0; Linear's default for fc) are torchvision's, so state names match torchvision's state_dict:
// 25,557,032 parameters in 161 tensors, and 159 BatchNorm buffers. The one zero3-specific change: each Bottleneck
// and fc are called through zero3::libtorch::call(), an ordinary forward call when the model is not wrapped.
#pragma once

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <zero3/libtorch.hpp>

inline torch::nn::Conv2d resnet_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

struct BottleneckImpl : torch::nn::Module {
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(int64_t in, int64_t planes, int64_t stride) {
    conv1 = register_module("conv1", resnet_conv(in, planes, 1, 1));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
    conv2 = register_module("conv2", resnet_conv(planes, planes, 3, stride));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
    conv3 = register_module("conv3", resnet_conv(planes, planes * kExpansion, 1, 1));
    bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
    if (stride != 1 || in != planes * kExpansion) {
      downsample = register_module("downsample", torch::nn::Sequential(resnet_conv(in, planes * kExpansion, 1, stride),
                                                                       torch::nn::BatchNorm2d(planes * kExpansion)));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    namespace F = torch::nn::functional;
    at::Tensor out = F::relu(bn1(conv1(x)));
    out = F::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return F::relu(out + (downsample ? downsample->forward(x) : x));
  }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetImpl : torch::nn::Module {
  // Bottleneck blocks per stage ({3, 4, 6, 3}: ResNet-50).
  explicit ResNetImpl(std::array<int64_t, 4> blocks = {3, 4, 6, 3}, int64_t num_classes = 1000) {
    conv1 = register_module("conv1",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
    int64_t in = 64;
    for (size_t s = 0; s < 4; ++s) {
      const int64_t planes = int64_t{64} << s;
      torch::nn::Sequential stage;
      for (int64_t b = 0; b < blocks[s]; ++b) {
        stage->push_back(Bottleneck(in, planes, b == 0 && s > 0 ? 2 : 1));
        in = planes * BottleneckImpl::kExpansion;
      }
      stages.push_back(register_module("layer" + std::to_string(s + 1), stage));
      for (int64_t b = 0; b < blocks[s]; ++b)
        unit_paths.push_back("layer" + std::to_string(s + 1) + "." + std::to_string(b));
    }
    fc = register_module("fc", torch::nn::Linear(in, num_classes));
    unit_paths.push_back("fc");
    // torchvision's initialization (fc keeps Linear's default).
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<torch::nn::BatchNorm2dImpl>()) {
        bn->weight.fill_(1.0);
        bn->bias.zero_();
      }
    }
  }

  // Logits [B, num_classes] for images [B, 3, H, W] (224x224 for ImageNet; any size from 32x32 runs).
  at::Tensor forward(const at::Tensor& images) {
    namespace F = torch::nn::functional;
    at::Tensor x = F::relu(bn1(conv1(images)));
    x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    for (const auto& stage : stages) {
      for (const auto& block : *stage) x = zero3::libtorch::call(block.ptr()->as<BottleneckImpl>(), x);
    }
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    return zero3::libtorch::call(fc, x);
  }

  // The submodules that are zero3 units: each Bottleneck ("layer1.0" ... "layer4.2") and fc. The stem (conv1, bn1:
  // 9,536 parameters) is the root unit.
  std::vector<std::string> unit_paths;

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  std::vector<torch::nn::Sequential> stages;  // layer1 ... layer4
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

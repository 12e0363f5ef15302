// The libtorch tests' CNN with batch normalization: two blocks of (Conv2d 3x3, batch norm, ReLU), a mean over the
// image, batch norm over the pooled features (N, C) and a linear head. The batch norms are torch's (BatchNorm2d,
// BatchNorm1d) or zero3's SyncBatchNorm: the parameters and buffers have the same names and initial values either
// way, so one trains with the other as its reference. Units: "block1", "block2" and "head"; the pooled features'
// norm ("norm") belongs to the root.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "support/libtorch_training.hpp"

namespace zero3::testing {

struct BnConvNetConfig {
  bool sync_batch_norm = false;
  int64_t in_channels = 3;
  int64_t channels = 4;
  int64_t classes = 3;
  std::optional<double> momentum = 0.1;  // nullopt: the cumulative average
};

// Built and initialized by torch after torch::manual_seed(seed), on the cpu.
std::shared_ptr<torch::nn::Module> make_bn_conv_net(const BnConvNetConfig& config, uint64_t seed);

// Logits (N, classes) for images (N, in_channels, H, W); the model and its units are called through
// zero3::libtorch::call.
at::Tensor bn_conv_net_logits(const std::shared_ptr<torch::nn::Module>& model, const at::Tensor& images);

std::vector<std::string> bn_conv_net_units();

// The global batch of optimizer step `step`: images (rows, in_channels, 5, 5) and labels (rows), on the cpu.
std::pair<at::Tensor, at::Tensor> bn_conv_net_batch(const BnConvNetConfig& config, int64_t rows, int64_t step);

// The module's buffers by name, copied to the cpu.
std::map<std::string, at::Tensor> buffers_on_cpu(const torch::nn::Module& model);

struct BnConvNetRun {
  std::vector<double> losses;  // per optimizer step
  ParamMap params;
  std::map<std::string, at::Tensor> buffers;  // on the cpu
};

// Plain libtorch in one process on the cpu: the model of make_bn_conv_net(config, seed), spec.steps steps of AdamW with
// the spec's lr and weight decay and clip_grad_norm_(spec.clip), each on the whole global batch of `rows`, whose loss
// is `loss(logits, labels)`.
using BatchLoss = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)>;
BnConvNetRun train_bn_conv_net_plain(const BnConvNetConfig& config, uint64_t seed, const TrainSpec& spec, int64_t rows,
                                     const BatchLoss& loss);

}  // namespace zero3::testing

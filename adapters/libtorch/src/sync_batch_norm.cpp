// SyncBatchNorm: the global batch's statistics through the engine's all_reduce_host, and their backward.
#include "zero3/libtorch/sync_batch_norm.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/var_mean.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>

#include <cmath>
#include <string>
#include <vector>

#include "model_core.hpp"

namespace zero3::libtorch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The global per-channel statistics of a batch: mean and biased variance (C), in the statistics' type, on the
// input's device, and the number of values per channel over every rank.
struct BatchStats {
  at::Tensor mean, var;
  double count = 0;
};

at::ScalarType stats_type(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// (C) -> (1, C, 1, ...), to broadcast against the input.
at::Tensor per_channel(const at::Tensor& t, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return t.view(shape);
}

// A count as two floats, each exact (below 2^24): high and low parts of a count below 2^48.
constexpr double kCountSplit = 16777216.0;

BatchStats global_stats(Engine* engine, const at::Tensor& input) {
  at::NoGradGuard no_grad;
  const at::Tensor x = input.detach().to(stats_type(input));
  const int64_t channels = input.size(1);
  const double local_count = channels == 0 ? 0.0 : static_cast<double>(input.numel() / channels);
  const std::vector<int64_t> dims = reduced_dims(x);
  auto [var, mean] = at::var_mean(x, at::IntArrayRef(dims), /*unbiased=*/false, /*keepdim=*/false);
  if (engine == nullptr || engine->world_size() == 1) {
    return {mean, var, local_count};
  }
  // Every rank's (count, mean, M2) in a slot of its own, zeros elsewhere: the sum is an all-gather.
  const int world = engine->world_size();
  const size_t slot = 2 + 2 * static_cast<size_t>(channels);
  std::vector<float> slots(slot * static_cast<size_t>(world), 0.0f);
  float* mine = slots.data() + slot * static_cast<size_t>(engine->rank());
  mine[0] = static_cast<float>(std::floor(local_count / kCountSplit));
  mine[1] = static_cast<float>(std::fmod(local_count, kCountSplit));
  if (local_count > 0) {
    const at::Tensor m = mean.to(at::kCPU, at::kFloat).contiguous();
    const at::Tensor m2 = (var * local_count).to(at::kCPU, at::kFloat).contiguous();
    std::copy(m.data_ptr<float>(), m.data_ptr<float>() + channels, mine + 2);
    std::copy(m2.data_ptr<float>(), m2.data_ptr<float>() + channels, mine + 2 + channels);
  }
  engine->all_reduce_host(slots.data(), slots.size(), ReduceOp::sum);
  // Chan et al.'s pairwise combination, rank by rank, in double: the same result on every rank.
  std::vector<double> total_mean(static_cast<size_t>(channels), 0.0), total_m2(static_cast<size_t>(channels), 0.0);
  double total = 0;
  for (int r = 0; r < world; ++r) {
    const float* s = slots.data() + slot * static_cast<size_t>(r);
    const double n = static_cast<double>(s[0]) * kCountSplit + static_cast<double>(s[1]);
    if (n == 0) continue;
    const double combined = total + n;
    for (int64_t c = 0; c < channels; ++c) {
      const double delta = static_cast<double>(s[2 + c]) - total_mean[static_cast<size_t>(c)];
      total_mean[static_cast<size_t>(c)] += delta * n / combined;
      total_m2[static_cast<size_t>(c)] +=
          static_cast<double>(s[2 + channels + c]) + delta * delta * total * n / combined;
    }
    total = combined;
  }
  std::vector<double> total_var(static_cast<size_t>(channels), 0.0);
  for (size_t c = 0; c < total_var.size(); ++c) total_var[c] = total > 0 ? total_m2[c] / total : 0.0;
  const at::TensorOptions host = at::TensorOptions().dtype(at::kDouble);
  const at::TensorOptions target = x.options();
  return {at::tensor(total_mean, host).to(target), at::tensor(total_var, host).to(target), total};
}

// y = (x - mean) * invstd * weight + bias, with the global statistics; backward with the global sums.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  // input (N, C, *); weight, bias (C) or undefined; mean, invstd (C) in the statistics' type; count: the global
  // number of values per channel.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean, const at::Tensor& invstd, double count,
                            Engine* engine) {
    const at::Tensor x = input.to(stats_type(input));
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(scale.scalar_type());
    at::Tensor y = (x - per_channel(mean, x)) * per_channel(scale, x);
    if (bias.defined()) y = y + per_channel(bias.to(y.scalar_type()), x);
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    // The engine outlives every backward of its model (the adapter's UnitBackward requires it).
    ctx->saved_data["engine"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(engine));
    return y.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto* engine = reinterpret_cast<Engine*>(static_cast<intptr_t>(ctx->saved_data["engine"].toInt()));
    variable_list grads(7);
    if (!grad_outputs[0].defined()) return grads;
    const at::ScalarType type = stats_type(input);
    const at::Tensor x = input.to(type);
    const at::Tensor dy = grad_outputs[0].to(type);
    const std::vector<int64_t> dims = reduced_dims(x);
    const at::Tensor x_hat = (x - per_channel(mean, x)) * per_channel(invstd, x);
    at::Tensor sum_dy = dy.sum(at::IntArrayRef(dims));                  // (C)
    at::Tensor sum_dy_x_hat = (dy * x_hat).sum(at::IntArrayRef(dims));  // (C)
    if (weight.defined()) {
      if (ctx->needs_input_grad(1)) grads[1] = sum_dy_x_hat.to(weight.scalar_type());
      if (ctx->needs_input_grad(2)) grads[2] = sum_dy.to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      if (engine != nullptr && engine->world_size() > 1) {
        const int64_t channels = x.size(1);
        at::Tensor sums = at::cat({sum_dy, sum_dy_x_hat}).to(at::kCPU, at::kFloat).contiguous();
        engine->all_reduce_host(sums.data_ptr<float>(), static_cast<size_t>(sums.numel()), ReduceOp::sum);
        sums = sums.to(x.options());
        sum_dy = sums.slice(0, 0, channels);
        sum_dy_x_hat = sums.slice(0, channels, 2 * channels);
      }
      at::Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(type);
      const at::Tensor dx =
          (dy - per_channel(sum_dy / count, x) - x_hat * per_channel(sum_dy_x_hat / count, x)) * per_channel(scale, x);
      grads[0] = dx.to(input.scalar_type());
    }
    return grads;
  }
};

at::Tensor batch_norm_over_ranks(Engine* engine, const at::Tensor& input, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                                 bool training, double momentum, double eps) {
  if (!input.defined() || input.dim() < 2) {
    throw InvalidArgument("zero3::libtorch::SyncBatchNorm: the input must be (N, C, *), got " +
                          (input.defined() ? c10::str(input.sizes()) : std::string("an undefined tensor")));
  }
  const int64_t channels = input.size(1);
  auto check_channels = [&](const char* name, const at::Tensor& t) {
    if (t.defined() && t.numel() != channels) {
      throw InvalidArgument(std::string("zero3::libtorch::SyncBatchNorm: the input has ") + std::to_string(channels) +
                            " channels (dimension 1 of " + c10::str(input.sizes()) + ") but " + name + " has " +
                            std::to_string(t.numel()) + " elements");
    }
  };
  check_channels("weight", weight);
  check_channels("bias", bias);
  check_channels("running_mean", running_mean);
  check_channels("running_var", running_var);
  if (!training) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias, false, momentum,
                                                     eps);
  }
  const BatchStats stats = global_stats(engine, input);
  if (stats.count <= 1) {
    throw InvalidArgument("zero3::libtorch::SyncBatchNorm: expected more than 1 value per channel when training, got " +
                          std::to_string(static_cast<int64_t>(stats.count)) + " over all ranks (input " +
                          c10::str(input.sizes()) + " on this rank)");
  }
  if (running_mean.defined() && running_var.defined()) {
    at::NoGradGuard no_grad;
    running_mean.mul_(1 - momentum).add_(stats.mean.to(running_mean.scalar_type()), momentum);
    const at::Tensor unbiased = stats.var * (stats.count / (stats.count - 1));
    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
  }
  const at::Tensor invstd = (stats.var + eps).rsqrt();
  return SyncBatchNormFunction::apply(input, weight, bias, stats.mean, invstd, stats.count, engine);
}

}  // namespace

at::Tensor sync_batch_norm(Engine& engine, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                           double momentum, double eps) {
  return batch_norm_over_ranks(&engine, input, weight, bias, running_mean, running_var, training, momentum, eps);
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_) : options(options_) { reset(); }

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    at::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();  // cumulative moving average
  }
  return batch_norm_over_ranks(detail::engine_of_current_call(), input, weight, bias, running_mean, running_var,
                               is_training() || !options.track_running_stats(), factor, options.eps());
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "zero3::libtorch::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

}  // namespace zero3::libtorch

// Batch normalization over the global batch: the batch statistics of every data-parallel rank's micro-batch
// together, as torch.nn.SyncBatchNorm computes them over its process group.
//
//   #include <zero3/libtorch/sync_batch_norm.hpp>
//
//   bn1 = register_module("bn1", zero3::libtorch::SyncBatchNorm(64));   // where the model had BatchNorm2d(64)
//
// SyncBatchNorm takes torch::nn::BatchNormOptions and registers what torch's BatchNorm1d/2d/3d register, under the
// same names (weight, bias, running_mean, running_var, num_batches_tracked), so state dicts, zero3 checkpoints and
// exports are those of the model with BatchNorm. One module serves every input shape (N, C, *): (N, C), (N, C, L),
// (N, C, H, W), (N, C, D, H, W).
//
// Training forward (or whenever running statistics are not tracked): each rank computes its micro-batch's per-channel
// count, mean and sum of squared deviations; one Engine::all_reduce_host gathers them from every rank (2 + 2C floats
// per rank), and every rank combines them, in rank order and in double precision, into the global mean and biased
// variance: the same numbers on every rank, so the running statistics (updated with the unbiased variance, as torch
// does) stay equal on every rank without any buffer synchronization. Ranks may hold different numbers of rows.
// Backward: the input's gradient needs the global per-channel sums of the output's gradient and of that gradient
// times the normalized input: one more all_reduce_host of 2C floats. The weight's and the bias's gradients are the
// rank's own sums; the engine's gradient reduction adds the ranks' (as DDP does for torch.nn.SyncBatchNorm).
// Evaluation (module.eval() with tracked statistics) normalizes with the running statistics, without communication.
//
// The engine: the module's forward uses the engine of the zero3::libtorch::ShardedModel whose call is running
// (the module is part of a wrapped model, called inside call(model, ...)). Called outside any such call (the same
// model trained by plain libtorch, one process) it is BatchNorm over the local batch. Every rank must call it at the
// same points (the collectives are the engine's, in its queue's order), in training and in evaluation alike.
//
// Precision: inputs of any floating type; the statistics are computed in float (double for double inputs) and the
// output has the input's type. Errors: InvalidArgument for an input that is not (N, C, *) with C = num_features, and
// for a training forward with one value per channel over all ranks (no variance), as torch's BatchNorm refuses it.
#pragma once

#include <cstdint>
#include <ostream>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include "zero3/engine.hpp"

namespace zero3::libtorch {

// The functional form: at::batch_norm's arguments (running statistics may be undefined; `momentum` is the factor
// of the new statistics), with the batch statistics taken over every rank of `engine` when `training` is true.
// Collective in training: every rank of the engine calls it at the same point.
at::Tensor sync_batch_norm(Engine& engine, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                           double momentum, double eps);

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);

  // Registers the parameters and buffers again, as torch's BatchNorm does.
  void reset() override;
  void reset_running_stats();
  void reset_parameters();

  // input (N, C, *) -> (N, C, *)
  at::Tensor forward(const at::Tensor& input);

  void pretty_print(std::ostream& stream) const override;

  torch::nn::BatchNormOptions options;
  at::Tensor weight, bias;                                    // (C); undefined without affine
  at::Tensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace zero3::libtorch

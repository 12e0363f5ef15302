// Training the test model two ways on the same data: plain libtorch in one process (torch::optim::AdamW over the
// whole global batch, clip_grad_norm_), and zero3 through the adapter (each rank its share of the global batch).
// The global batch of optimizer step s is micro-batches (s, i) for i < world size x gradient accumulation steps (rank
// r's k-th micro-step takes i = k x world + r); both runs average the loss over it, so their gradients agree up to
// the order of the additions, and any world size with the same product trains on the same batches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "support/tiny_llama.hpp"
#include "zero3/config.hpp"
#include "zero3/libtorch.hpp"

namespace zero3::testing {

struct TrainSpec {
  int64_t steps = 3;        // optimizer steps
  int64_t micro_batch = 2;  // sequences per rank and micro-step
  int world = 1;            // ranks the global batch is split over
  int64_t gas = 1;          // gradient accumulation steps
  double lr = 1e-2;
  double weight_decay = 0.01;
  double clip = 1.0;
  uint64_t data_seed = 7;
};

// Token ids [micro_batch, seq + 1] of micro-batch `index` of optimizer step `step`: inputs are [:, :-1], targets
// [:, 1:].
at::Tensor token_batch(const TinyLlamaConfig& model, const TrainSpec& spec, int64_t step, int64_t index);

using ParamMap = std::map<std::string, std::vector<float>>;

struct TrainRun {
  std::vector<double> losses;      // per optimizer step: the mean loss over its global batch
  std::vector<double> grad_norms;  // per optimizer step: the global gradient norm before clipping
  ParamMap params;             // final weights by the module's names (a tied weight under its first name)
};

// Plain libtorch: the model of make_tiny_llama(model, seed), AdamW with the spec's settings, one process.
TrainRun train_plain_libtorch(const TinyLlamaConfig& model, uint64_t seed, const TrainSpec& spec);

// The same settings as a zero3 config (AdamW, clipping, constant lr) at `stage`, not yet resolved.
Config libtorch_test_config(int stage, const TrainSpec& spec);

// Trains optimizer steps [first_step, first_step + spec.steps) through `sharded` (collective); losses are averaged
// over the ranks with Engine::all_reduce_host. `params` is filled by gather_state_dict() (collective).
TrainRun train_sharded(libtorch::ShardedModel& sharded, const TinyLlamaConfig& model, const TrainSpec& spec,
                       int64_t first_step = 0);

ParamMap to_param_map(const torch::OrderedDict<std::string, at::Tensor>& state);

}  // namespace zero3::testing

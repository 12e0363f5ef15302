// The model of the engine's equivalence tests, and an unsharded single-process reference that trains it.
//
// The model is a small MLP with odd sizes, four units and seven parameters:
//
//   x (in) -> fc1: tanh(W1 x + b1) -> norm: * g -> fc2: tanh(W2 a + b2) -> head: W3 a + b3 -> y (out)
//   loss of a micro-batch = mean over its samples of 0.5 * sum_o (y_o - t_o)^2
//
// The reference knows nothing of the engine: it holds every parameter whole, averages the gradients of all
// ranks' micro-batches itself, and applies gradient clipping, WarmupLR and Adam/AdamW as textbook code
// written from DeepSpeed's definitions. It shares with the engine only the model arithmetic below (the
// layer functions) and the Philox initialisation (tested on its own), so a difference points at the
// engine's partitioning, reduction, scheduling or optimizer plumbing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero3/config.hpp"
#include "zero3/unit.hpp"

namespace zero3::testing {

struct MlpDims {
  int64_t in = 13;
  int64_t h1 = 37;
  int64_t h2 = 29;
  int64_t out = 7;
};

// One parameter of the model: unit, name, shape and init rule (the same table feeds both trainers).
struct MlpParamDesc {
  std::string unit;
  std::string name;
  std::vector<int64_t> shape;
  ParamInit init = ParamInit::zeros();
  std::string full_name() const { return unit + "." + name; }
  int64_t numel() const;
};

// In unit order: fc1 (w, b), norm (g), fc2 (w, b), head (w, b).
std::vector<MlpParamDesc> mlp_params(const MlpDims& dims);
std::vector<std::string> mlp_units();

// A batch of samples for micro-batch `index` of the data stream `seed`: x is (batch, in), t is (batch, out).
struct Batch {
  int64_t size = 0;
  std::vector<float> x;
  std::vector<float> t;
};
Batch make_batch(const MlpDims& dims, uint64_t seed, int64_t index, int64_t batch);

// The model's arithmetic, unit by unit (row-major; W is (out, in)).
struct MlpActivations {
  std::vector<float> x, a1, a1n, a2, y;
};
void linear_forward(const float* w, const float* b, const float* x, float* y, int64_t batch, int64_t in, int64_t out);
// dw += dy^T x, db += sum over the batch of dy, dx = dy W (dx may be null).
void linear_backward(const float* w, const float* x, const float* dy, float* dw, float* db, float* dx, int64_t batch,
                     int64_t in, int64_t out);
double mse_loss(const std::vector<float>& y, const std::vector<float>& t, int64_t batch, std::vector<float>* dy);

// Which micro-batch of the data stream rank `rank` uses at optimizer step `step`, micro-step `micro`.
inline int64_t batch_index(int64_t step, int64_t micro, int64_t gas, int rank, int world) {
  return (step * gas + micro) * world + rank;
}

struct TrainPlan {
  MlpDims dims;
  int world = 1;
  int64_t micro_batch = 3;
  int64_t steps = 10;  // optimizer steps
  uint64_t data_seed = 7;
};

struct ReferenceRun {
  // losses[step][micro][rank]
  std::vector<std::vector<std::vector<double>>> losses;
  std::vector<double> grad_norms;  // per optimizer step, before clipping
  std::vector<double> lrs;
  std::map<std::string, std::vector<float>> params;  // final fp32 weights by full name
};

// Trains the model on one process exactly as `world` data-parallel ranks with `config` should: initial
// weights from Philox (config.zero3.seed), gradient accumulation, clipping (DeepSpeed's coefficient),
// WarmupLR (linear or log) or a constant lr, Adam/AdamW. `compute` bf16/f16 rounds the weights the layers
// see, as the engine's 16-bit compute copies do; the master weights stay fp32.
ReferenceRun run_reference(const Config& config, const TrainPlan& plan);

}  // namespace zero3::testing

// The pipeline tests' model: a chain of linear layers (tanh between them, none after the last) with a mean squared
// error loss, small and of uneven widths, so that every stage boundary has its own activation size. One unit per
// layer ("layers.<i>": w of (out, in), b of (out)), trained two ways on the same data:
//   - unpipelined, on an Engine: every layer's forward and backward scopes in one micro-step (train_chain_step);
//   - pipelined, as a PipelineModel (ChainStages): each stage runs its layers on the activation it receives.
// The data of micro-batch `index` on data-parallel rank r of d ranks is make_batch(..., index * d + r), in both.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/reference_model.hpp"
#include "zero3/engine.hpp"
#include "zero3/pipeline_engine.hpp"

namespace zero3::testing {

struct ChainDims {
  std::vector<int64_t> widths = {13, 24, 20, 22, 18, 21, 19, 17, 7};  // in, hidden..., out: 8 layers
  int64_t micro_batch = 3;
  uint64_t data_seed = 11;
  size_t layers() const { return widths.size() - 1; }
};

inline std::string chain_layer_name(size_t i) { return "layers." + std::to_string(i); }

inline std::vector<ParamSpec> chain_layer_params(const ChainDims& d, size_t i) {
  return {{"w", {d.widths[i + 1], d.widths[i]}, ParamInit::normal(0.3)}, {"b", {d.widths[i + 1]}, ParamInit::zeros()}};
}

inline std::vector<PipelineLayer> chain_pipeline_layers(const ChainDims& d) {
  std::vector<PipelineLayer> out;
  for (size_t i = 0; i < d.layers(); ++i) {
    out.push_back({chain_layer_name(i), d.widths[i + 1] * d.widths[i] + d.widths[i + 1],
                   d.micro_batch * d.widths[i + 1]});
  }
  return out;
}

// The samples of one micro-batch: x of (batch, widths.front()), t of (batch, widths.back()).
inline Batch chain_batch(const ChainDims& d, int64_t data_index, int dp_rank, int dp_size) {
  MlpDims m;
  m.in = d.widths.front();
  m.out = d.widths.back();
  return make_batch(m, d.data_seed, data_index * dp_size + dp_rank, d.micro_batch);
}

// Layer i's forward on `x` (batch rows) into y; tanh unless it is the last layer.
inline void chain_layer_forward(const ChainDims& d, size_t i, const UnitScope& s, const float* x, float* y) {
  linear_forward(s.param("w").as<float>(), s.param("b").as<float>(), x, y, d.micro_batch, d.widths[i], d.widths[i + 1]);
  if (i + 1 < d.layers()) {
    for (int64_t k = 0; k < d.micro_batch * d.widths[i + 1]; ++k) y[k] = std::tanh(y[k]);
  }
}

// Layer i's backward: dy is d loss / d (its output); x its input, y its output. Adds the weight gradients into
// the scope and writes dx (when not null).
inline void chain_layer_backward(const ChainDims& d, size_t i, const UnitScope& s, const float* x, const float* y,
                                 const float* dy, float* dx) {
  const int64_t n = d.micro_batch * d.widths[i + 1];
  std::vector<float> dz(dy, dy + n);
  if (i + 1 < d.layers()) {
    for (int64_t k = 0; k < n; ++k) dz[k] *= 1.0f - y[k] * y[k];
  }
  linear_backward(s.param("w").as<float>(), x, dz.data(), s.grad("w").as<float>(), s.grad("b").as<float>(), dx,
                  d.micro_batch, d.widths[i], d.widths[i + 1]);
}

// The layers [first, end) forward from `input` (activations[0]); activations[k] is layer first+k's input, the
// last entry the output.
inline std::vector<std::vector<float>> chain_forward(Engine& e, const ChainDims& d, size_t first, size_t end,
                                                     const float* input) {
  std::vector<std::vector<float>> acts(1, std::vector<float>(input, input + d.micro_batch * d.widths[first]));
  for (size_t i = first; i < end; ++i) {
    std::vector<float> y(static_cast<size_t>(d.micro_batch * d.widths[i + 1]));
    auto s = e.forward_scope(*e.find_unit(chain_layer_name(i)));
    chain_layer_forward(d, i, s, acts.back().data(), y.data());
    acts.push_back(std::move(y));
  }
  return acts;
}

// Backward through layers [first, end) from dy; returns d loss / d input.
inline std::vector<float> chain_backward(Engine& e, const ChainDims& d, size_t first, size_t end,
                                         const std::vector<std::vector<float>>& acts, std::vector<float> dy) {
  for (size_t i = end; i-- > first;) {
    const size_t k = i - first;
    std::vector<float> dx(static_cast<size_t>(d.micro_batch * d.widths[i]));
    auto s = e.backward_scope(*e.find_unit(chain_layer_name(i)));
    chain_layer_backward(d, i, s, acts[k].data(), acts[k + 1].data(), dy.data(), dx.data());
    dy = std::move(dx);
  }
  return dy;
}

// The loss of the chain's output against the batch's targets, and d loss / d output (times `scale`).
inline double chain_loss(const ChainDims& d, const Batch& b, const std::vector<float>& y, double scale,
                         std::vector<float>* dy) {
  const double loss = mse_loss(y, b.t, d.micro_batch, dy);
  if (dy != nullptr && scale != 1.0) {
    for (float& v : *dy) v *= static_cast<float>(scale);
  }
  return loss;
}

// One unpipelined micro-step on `e` (fp32 parameters): forward and backward of every layer. Returns the loss.
inline double train_chain_micro_step(Engine& e, const ChainDims& d, int64_t data_index) {
  Batch b = chain_batch(d, data_index, e.rank(), e.world_size());
  auto acts = chain_forward(e, d, 0, d.layers(), b.x.data());
  std::vector<float> dy;
  const double loss = chain_loss(d, b, acts.back(), e.loss_scale(), &dy);
  chain_backward(e, d, 0, d.layers(), acts, std::move(dy));
  return loss;
}

// The pipelined model: each stage's layers, with the activations it keeps by micro-batch until its backward.
class ChainStages : public PipelineModel {
 public:
  explicit ChainStages(ChainDims dims) : dims_(std::move(dims)) {}

  void declare(Engine& e, const PipelineStageInfo& s) override {
    for (size_t i = s.first_layer; i < s.end_layer; ++i) e.add_unit(chain_layer_name(i), chain_layer_params(dims_, i));
  }

  double forward(Engine& e, const PipelineCall& c) override {
    const PipelineStageInfo& s = *c.stage;
    Batch b = chain_batch(dims_, c.data_index, e.rank(), e.world_size());
    const float* in = s.is_first() ? b.x.data() : c.input.as<float>();
    auto acts = chain_forward(e, dims_, s.first_layer, s.end_layer, in);
    double loss = 0.0;
    if (s.is_last()) {
      loss = chain_loss(dims_, b, acts.back(), 1.0, nullptr);
    } else {
      std::copy(acts.back().begin(), acts.back().end(), c.output.as<float>());
    }
    if (c.training) kept_[{s.stage, c.micro_batch}] = std::move(acts);
    return loss;
  }

  void backward(Engine& e, const PipelineCall& c) override {
    const PipelineStageInfo& s = *c.stage;
    auto it = kept_.find({s.stage, c.micro_batch});
    if (it == kept_.end()) throw InvalidArgument("ChainStages: backward before forward");
    std::vector<float> dy;
    if (s.is_last()) {
      Batch b = chain_batch(dims_, c.data_index, e.rank(), e.world_size());
      chain_loss(dims_, b, it->second.back(), e.loss_scale(), &dy);
    } else {
      const float* g = c.grad_output.as<float>();
      dy.assign(g, g + c.grad_output.numel);
    }
    std::vector<float> dx = chain_backward(e, dims_, s.first_layer, s.end_layer, it->second, std::move(dy));
    if (!s.is_first()) std::copy(dx.begin(), dx.end(), c.grad_input.as<float>());
    kept_.erase(it);
  }

  // Micro-batches whose activations wait for their backward.
  size_t kept() const { return kept_.size(); }

 private:
  ChainDims dims_;
  std::map<std::pair<int, int64_t>, std::vector<std::vector<float>>> kept_;
};

}  // namespace zero3::testing

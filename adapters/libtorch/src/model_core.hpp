// The state behind a ShardedModel: the model's units and parameters as the engine declared them, where each
// parameter tensor's storage points, and the calls in progress. unit_call.cpp runs the calls and their backward;
// sharded_model.cpp declares, materializes and answers queries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "zero3/engine.hpp"
#include "zero3/libtorch.hpp"

namespace zero3::libtorch::detail {

struct InitSource;

// One parameter tensor of the module.
struct TorchParam {
  std::string name;  // the module's name for it ("blocks.0.attn.qkv.weight")
  at::Tensor tensor;  // the module's own tensor: its TensorImpl is what the module and autograd hold
  std::vector<int64_t> shape;
  ParamId id;
  int unit = -1;  // index into ModelCore::units
  std::shared_ptr<InitSource> init;  // the values at wrapping, until materialize()
};

// The model (root) or one named submodule.
struct UnitDesc {
  std::string name;  // the engine's unit name: the submodule's path, or WrapOptions::root_unit
  std::string path;  // the submodule's path; "" for the model
  torch::nn::Module* module = nullptr;
  UnitId id;  // invalid when the unit has no parameters (then nothing is declared or gathered for it)
  std::vector<int> params;  // indices into ModelCore::params
  bool root = false;
  bool checkpoint = false;
  // The module's parameters at wrapping (name, TensorImpl), to find a module changed afterwards.
  std::vector<std::pair<std::string, const c10::TensorImpl*>> registered;
  int open = 0;  // calls in progress (forward, or the recomputation of a checkpointed backward)
};

// One call in progress during the training forward: what a nested call needs from the call around it.
struct Frame {
  int unit = -1;
  at::Tensor anchor;  // made when a nested call records a node: the enclosing backward computes its gradient
                      // so that autograd runs the nested nodes (see unit_call.cpp)
};

class ModelCore : public std::enable_shared_from_this<ModelCore> {
 public:
  ModelCore(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options);
  ~ModelCore();

  Engine& engine;
  std::shared_ptr<torch::nn::Module> model;
  WrapOptions options;
  std::vector<UnitDesc> units;
  std::vector<TorchParam> params;
  std::unordered_map<const c10::TensorImpl*, int> param_by_impl;
  at::Device device{at::kCPU};
  at::ScalarType compute_type = at::kFloat;
  at::ScalarType grad_type = at::kFloat;

  bool materialized = false;
  std::vector<Frame> frames;             // training calls in progress, outermost first
  int64_t backward_micro_step = -1;      // the micro-step in which a unit's backward last ran
  bool in_scaled_backward = false;       // inside ShardedModel::backward()

  // Points the unit's parameter tensors at the scope's gathered buffer (full shapes), or empties them.
  void point(const UnitDesc& unit, const UnitScope& scope);
  void empty(const UnitDesc& unit);
  // Throws InvalidArgument when the unit's module no longer has the parameters it had at wrapping, or a
  // parameter of the unit carries a gradient hook.
  void check_unchanged(const UnitDesc& unit) const;
  bool is_open_in_forward(int unit) const;
  std::string describe_param(int index) const;  // "parameter 'x' of unit 'u'"
};

// Empties a unit's parameters when it goes out of scope (normal exit and exceptions alike).
class PointedUnit {
 public:
  PointedUnit(ModelCore& core, const UnitDesc& unit, const UnitScope& scope) : core_(core), unit_(unit) {
    core_.point(unit_, scope);
  }
  ~PointedUnit() { core_.empty(unit_); }
  PointedUnit(const PointedUnit&) = delete;
  PointedUnit& operator=(const PointedUnit&) = delete;

 private:
  ModelCore& core_;
  const UnitDesc& unit_;
};

at::ScalarType scalar_type_of(DType dtype);

}  // namespace zero3::libtorch::detail

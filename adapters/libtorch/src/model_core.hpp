// The state behind a ShardedModel: the model's units and parameters as the engine declared them, where each
// parameter tensor's storage points, and the calls in progress. unit_call.cpp runs the calls and their backward;
// sharded_model.cpp declares, materializes and answers queries.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "stream_order.hpp"
#include "zero3/engine.hpp"
#include "zero3/libtorch.hpp"

namespace zero3::libtorch::detail {

struct UnitRebuilder;

// A parameter's values at wrapping, read by the engine while it materializes, then released: the tensor's own
// values, or those of its unit's factory run again (UnitFactory).
struct InitSource {
  at::Tensor values;  // flat, contiguous, on the parameter's device
  std::shared_ptr<UnitRebuilder> rebuild;
  int factory = -1;
  std::string local;  // the parameter's name inside the factory's module
};

// Units built by UnitFactory (unit_factories.cpp): the first run of each factory at wrapping, and the second in
// materialize(), one module at a time.
struct UnitRebuilder {
  std::vector<UnitFactory> factories;
  std::vector<at::Tensor> rng_states;  // the CPU generator before each factory's first run
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> declared;  // each module's parameters
  at::Tensor rng_after;                // the generator after the first runs, given back after materialize()

  // Builds every factory's module in turn, installs it in `model` and frees its parameters' storage (their sizes
  // stay, for the declaration) before the next.
  void build_all(torch::nn::Module& model);
  // Elements [begin, end) of parameter `local` of factory `factory`'s module, built again when it is not the one
  // held (the one held is released first).
  void read(int factory, const std::string& local, int64_t begin, int64_t end, float* out);
  // Releases the module held and gives the CPU generator back its state after build_all().
  void finish();
  // The factory whose path holds parameter `name`, or -1.
  int factory_of(const std::string& name) const;

 private:
  int built_ = -1;
  std::shared_ptr<torch::nn::Module> module_;
  std::unordered_map<std::string, at::Tensor> flat_;  // the held module's parameters, flat
};

at::Tensor cpu_rng_state();
void set_cpu_rng_state(const at::Tensor& state);

// The generators a unit's forward draws from: the CPU's, and on a cuda engine the device's.
struct RngStates {
  at::Tensor cpu;
  at::Tensor device;  // undefined on the cpu device
};

// One parameter tensor of the module.
struct TorchParam {
  std::string name;  // the module's name for it ("blocks.0.attn.qkv.weight")
  std::vector<std::string> also;  // its other names (a parameter registered under two modules)
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

// A parameter of a unit not in use seen as an op's input (a unit called directly): unit_call.cpp.
struct IdleUse {
  int param = -1;  // index into ModelCore::params; -1: none seen
  int user = 0;    // the innermost unit in use then (0: only the model's call)
  std::string op;  // the op that used it ("aten::linear")
};

class ModelCore : public std::enable_shared_from_this<ModelCore> {
 public:
  ModelCore(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options,
            std::shared_ptr<UnitRebuilder> rebuilder = nullptr);
  ~ModelCore();

  Engine& engine;
  std::shared_ptr<torch::nn::Module> model;
  WrapOptions options;
  std::vector<UnitDesc> units;
  std::vector<TorchParam> params;
  std::unordered_map<const c10::TensorImpl*, int> param_by_impl;
  at::Device device{at::kCPU};
  std::unique_ptr<StreamOrder> streams;  // torch's stream against the engine's (cuda); null on the cpu device
  at::ScalarType compute_type = at::kFloat;
  at::ScalarType grad_type = at::kFloat;

  std::shared_ptr<UnitRebuilder> rebuilder;  // units built by UnitFactory; null without
  bool materialized = false;
  std::vector<Frame> frames;             // training calls in progress, outermost first
  int64_t backward_micro_step = -1;      // the micro-step in which a unit's backward last ran
  bool in_scaled_backward = false;       // inside ShardedModel::backward()
  bool watch_training = true;            // the model's training calls watch for idle units' parameters until one
  bool watch_evaluation = true;          // completes without using any; the same for evaluation calls
  IdleUse idle_use;
  // Host copies of device buffers handed to the engine (Engine::buffers(), for a save, load or export), each with
  // its values when handed: a load writes them, and apply_loaded_buffers() copies what changed to the device.
  struct HandedBuffer {
    at::Tensor buffer, host, handed;
  };
  std::vector<HandedBuffer> handed_buffers;

  // Points the unit's parameter tensors at the scope's gathered buffer (full shapes), or empties them.
  void point(const UnitDesc& unit, const UnitScope& scope);
  void empty(const UnitDesc& unit);
  // Throws InvalidArgument when the unit's module no longer has the parameters it had at wrapping, or a
  // parameter of the unit carries a gradient hook.
  void check_unchanged(const UnitDesc& unit) const;
  bool is_open_in_forward(int unit) const;
  std::string describe_param(int index) const;  // "parameter 'x' of unit 'u'"
  RngStates rng_states() const;
  void set_rng_states(const RngStates& states) const;
};

// The engine of the ShardedModel whose call (or unit backward) runs on this thread, or null (SyncBatchNorm's).
Engine* engine_of_current_call();

// A unit's parameters pointed at a scope's memory while it lives, and emptied when it goes out of scope (normal exit
// and exceptions alike). On a cuda engine torch's stream waits for the engine's first, and the engine's for torch's
// at the end, before the scope closes.
class PointedUnit {
 public:
  PointedUnit(ModelCore& core, const UnitDesc& unit, const UnitScope& scope);
  ~PointedUnit();
  PointedUnit(const PointedUnit&) = delete;
  PointedUnit& operator=(const PointedUnit&) = delete;
  // Orders the engine's stream after torch's and empties the parameters now (the normal end: throws what the
  // ordering raised; the destructor logs it instead).
  void release();

 private:
  ModelCore& core_;
  const UnitDesc& unit_;
  bool released_ = false;
};

at::ScalarType scalar_type_of(DType dtype);

// The model's buffers (model_buffers.cpp): each buffer once, under its first name, in the module's order.
struct NamedBuffer {
  std::string name;
  at::Tensor tensor;
};
std::vector<NamedBuffer> model_buffers(const torch::nn::Module& model);
// Checks every buffer (contiguous, on the engine's device, of a type safetensors has) and makes them the engine's
// buffers (on a cuda engine through host copies: see ModelCore::handed_buffers).
void register_buffers(ModelCore& core);
// Copies to the device the host copies of device buffers that a load changed since they were handed out.
void apply_loaded_buffers(ModelCore& core);
// Collective (one Engine::all_reduce_host): the buffers synchronized across the ranks by `mode`.
void sync_buffers(ModelCore& core, BufferSync mode);

// The values of a module's buffers, put back when it goes out of scope: a checkpointed unit's recomputation then
// leaves the running statistics as the forward left them.
class KeptBuffers {
 public:
  explicit KeptBuffers(torch::nn::Module& module);
  ~KeptBuffers();
  KeptBuffers(const KeptBuffers&) = delete;
  KeptBuffers& operator=(const KeptBuffers&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;  // (buffer, its value)
};

}  // namespace zero3::libtorch::detail

// ZeRO for libtorch: a torch::nn model trained by the zero3 engine, with autograd opening the engine's scopes.
//
// The program builds its model with torch::nn as usual, names the submodules that are units (each transformer
// block, the embedding, the head), and routes the calls of those submodules, and of the model itself, through
// zero3::libtorch::call(). The DeepSpeed config drives everything else: stage, optimizer, precision, buckets,
// offload, checkpoints.
//
//   #include <zero3/libtorch.hpp>
//
//   // In the model's forward, one change per unit call site: block->forward(x) becomes
//   for (auto& block : blocks_) x = zero3::libtorch::call(block, x);
//
//   zero3::Session s = zero3::initialize("ds_config.json", opts);
//   auto model = std::make_shared<GPT>(cfg);                 // built and initialized by torch, on every rank
//   zero3::libtorch::ShardedModel sharded(*s.engine, model, {.units = {"tok_emb", "blocks.0", "blocks.1", "head"}});
//   sharded.materialize();                                   // collective; the module's full tensors are freed
//   for (...) {
//     at::Tensor loss = torch::nn::functional::cross_entropy(zero3::libtorch::call(model, x), y);
//     sharded.backward(loss);                                // loss.backward(), with fp16's loss scale
//     sharded.step();                                        // Engine::step(): zero3's Adam/AdamW at the boundary
//   }
//
// Contract (docs/libtorch.md has the long form):
//  - Units. Each named submodule's parameters form one zero3 unit, named by the submodule's path; every other
//    parameter of the model forms the root unit (WrapOptions::root_unit), gathered for the whole of every forward
//    and backward. A parameter shared by two units (tied weights) belongs to the root. Engine parameters are named
//    "<unit>.<the module's own parameter name>", so exports and consolidated checkpoints carry the module's names.
//  - Parameters. After materialize() a parameter tensor of the module is empty (sizes {0}, a storage of 0
//    bytes) except while its unit is in use: inside call() of its unit (the forward scope), and inside the
//    unit's backward (the backward scope), where it has its full shape and its storage is the engine's
//    gathered buffer. Its grad() stays undefined: the gradients go to the engine's reducer. Tensors kept from a
//    parameter outside its unit (a transpose made in the constructor) are refused when used.
//  - Calls. call(module, args...) runs module.forward(args...). Tensors among the arguments are the call's
//    inputs; the result is a tensor, a std::tuple of tensors or a std::vector of tensors. Everything the forward
//    uses that requires gradients must be an argument, a parameter of the unit, or a parameter of a unit whose
//    call encloses this one (the root's, for the units): anything else is an error naming it. The model itself is
//    called through call() too (the root): units are called inside it. A module that is neither the model nor
//    a unit runs its forward directly, so the same model code trains without zero3.
//  - Autograd. A unit's call records one node in the autograd graph; its backward opens the unit's backward
//    scope (the gather again, prefetched along the engine's recorded order), runs the unit's own backward
//    (recomputing its forward first for units in WrapOptions::checkpoint, with the CPU generator's state of the
//    forward), adds the parameters' gradients into the scope's buffer and closes it (reduce-scatter).
//  - Buffers. Every buffer of the model (register_buffer: BatchNorm's running statistics) stays whole on every rank
//    and is part of the model's state: synchronized across the ranks (WrapOptions::buffer_sync) when the model is
//    materialized and at every step(); saved by zero3::save_checkpoint (rank 0's) and restored by load_checkpoint on
//    any world size; written by save_16bit_model and consolidate_checkpoint under the module's names, in their own
//    types. A checkpointed unit's recomputation in backward leaves them as its forward left them (not updated
//    twice). Buffers: contiguous, on the engine's device, of a real or integer type (InvalidArgument at wrapping).
//  - Training. One micro-step is one or more calls of the model, one backward, then step(); gradient
//    accumulation is the config's gradient_accumulation_steps. Under torch::NoGradGuard a call is an error unless
//    the engine is evaluating (evaluate()). torch::optim does not apply: the parameters have no gradient.
//
// Errors are zero3::InvalidArgument (a misuse, raised before any gradient it would make wrong is computed or
// applied) naming the unit, the parameter or the module and what to do; errors of the engine (communication,
// memory) are the engine's. Device: cpu, or cuda with a CUDA build of libtorch (else Unsupported): parameters and
// gradients are views of the engine's device memory, torch's current stream and the engine's ordered by events.
// Threads: one thread drives a ShardedModel and its calls; backward may run on libtorch's autograd device thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include "zero3/checkpoint.hpp"
#include "zero3/engine.hpp"

namespace zero3::libtorch {

// How the model's buffers (BatchNorm's running statistics, any tensor registered with register_buffer) are kept the
// same on every data-parallel rank. Both write rank 0's buffers into every rank when the model is materialized, and
// synchronize at the end of every ShardedModel::step() (every micro-step), so the next forward on every rank starts
// from the same buffers, as DDP's default broadcast before each forward does.
enum class BufferSync : uint8_t {
  broadcast,  // rank 0's buffers replace every rank's (DDP's broadcast_buffers): the statistics of rank 0's batches
  average,    // floating-point buffers become their mean over the ranks (each rank's statistics count); integer
              // buffers (num_batches_tracked) take rank 0's value
};

struct WrapOptions {
  // Paths of the submodules that are units, as Module::named_modules() spells them ("blocks.0", "tok_emb"). A
  // unit may not contain another. Their order does not matter: units are declared in the model's module order.
  std::vector<std::string> units = {};
  // Units recomputed in backward (activation checkpointing): their forward keeps only its inputs.
  std::vector<std::string> checkpoint = {};
  // The engine's name for the unit of every other parameter. Not declared when no parameter is left for it.
  std::string root_unit = "root";
  BufferSync buffer_sync = BufferSync::broadcast;
};

// A unit the adapter builds itself, so that no rank ever holds more than one unit at full size (libtorch's modules
// allocate and initialize their parameters in their constructors; a model built whole needs its full size on every
// rank first). See ShardedModel's second constructor.
struct UnitFactory {
  // The unit's path in the model ("blocks.3"); it becomes a unit (listing it in WrapOptions::units is optional).
  std::string path;
  // Constructs the unit's module at full size. Called twice: when the model is wrapped (its parameters are then
  // declared and their storage freed) and in materialize() (this rank's slices are read, then the module is
  // released), each time with the CPU generator in the state it had before the first call: what it builds must
  // depend on nothing else (InvalidArgument when the second module's parameters differ in names or shapes).
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  // Registers the first module in the model at `path`. Unset: the parent's register_module(), or push_back() when
  // the parent is a ModuleList (the path's last part must then be its size).
  std::function<void(std::shared_ptr<torch::nn::Module>)> install = nullptr;
};

namespace detail {
class ModelCore;
}

// What the parameters of the module hold now (measured on the tensors themselves).
struct ParamResidency {
  int64_t parameters = 0;       // the module's parameters
  int64_t full = 0;             // of them, at their full shape now (their unit in use)
  int64_t full_bytes = 0;       // the bytes of those
  int64_t storage_bytes = 0;    // bytes of every parameter's storage (0 outside all units)
};

class ShardedModel {
 public:
  // Declares the model's parameters to `engine` (which must not be materialized), one unit per name in
  // `options.units` plus the root. The parameters' current values (torch's initialization, or weights the
  // program loaded) become the initial values. InvalidArgument for a unit path that is not a submodule, units
  // that nest, a parameter that is not a leaf, does not require gradients, is not of the engine's compute dtype
  // (bf16/fp16 in the config: convert the model with model->to() first) or lives on another device, for a
  // module already wrapped, for a checkpointed unit whose module holds a parameter of another unit or of the root (a
  // tied weight: naming both), and for a buffer not contiguous, on the engine's device, of a real or integer type. The
  // model's buffers are registered with the engine (Engine::set_buffer_source) for checkpoints and exports.
  ShardedModel(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options = {});
  // The same for a model whose units are built here, one at a time: `model` holds the rest (the root's parameters,
  // the units built as usual, and the parents the factories' units go into). For each factory in order, its module
  // is constructed, installed at its path, and its parameters' storage is freed before the next one is constructed;
  // materialize() builds each again, reads this rank's slices and releases it before building the next. Every
  // rank's peak is one unit at full size plus the rest of the model. The initial values are the modules' own, as if
  // the factories had run once in this order.
  ShardedModel(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options,
               std::vector<UnitFactory> factories);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  // Collective: Engine::materialize(), then every parameter tensor of the module is emptied and its storage freed,
  // and every rank's buffers become rank 0's.
  void materialize();

  // loss.backward(), multiplied by the engine's loss scale when fp16 scales it. With fp16 loss scaling a bare
  // loss.backward() is an error (its gradients would be unscaled by the wrong factor).
  void backward(const at::Tensor& loss);
  // Engine::step(): ends the micro-step; at a boundary zero3's optimizer steps. Then the buffers are synchronized
  // (WrapOptions::buffer_sync). InvalidArgument inside a call.
  StepResult step();
  // Collective: synchronizes the buffers now, as step() does (after changing them outside training, e.g. after
  // loading a model's statistics on rank 0 only).
  void sync_buffers();
  // The module's buffers by their names, in the module's order (a buffer registered twice under its first name):
  // what checkpoints, consolidation and save_16bit_model write beside the parameters.
  std::vector<std::string> buffer_names() const;
  // Engine::evaluate(): calls run without gradients until the returned EvalMode ends.
  EvalMode evaluate();

  Engine& engine() const;
  const std::shared_ptr<torch::nn::Module>& module() const;
  // Engine unit names in declaration order (the root, when it has parameters, first).
  std::vector<std::string> unit_names() const;
  // The engine unit of the module parameter `name` ("blocks.0.attn.qkv.weight"); InvalidArgument if none.
  UnitId unit_of(const std::string& name) const;

  // Collective (one gather per unit): every parameter's full fp32 master value, by the module's names, in the
  // module's order. For evaluation with plain libtorch, or to compare against a reference.
  torch::OrderedDict<std::string, at::Tensor> gather_state_dict();
  // Export options that name tensors by the module's parameter names (save_16bit_model, consolidate_checkpoint).
  ExportOptions export_options() const;

  ParamResidency residency() const;

 private:
  std::shared_ptr<detail::ModelCore> core_;
};

// ---- call(): the only template part. It turns any forward signature into a list of tensors and back. ----

namespace detail {

using ForwardFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// The model or a unit of a live ShardedModel.
struct UnitRef {
  ModelCore* core = nullptr;
  int unit = -1;
  explicit operator bool() const { return core != nullptr; }
};
UnitRef find_unit(const torch::nn::Module* module);
// Runs `forward` on `inputs` as a call of `unit` (the scopes, the autograd node) and returns its outputs.
std::vector<at::Tensor> run_unit(UnitRef unit, std::vector<at::Tensor> inputs, ForwardFn forward);

template <typename T>
inline constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;

// The module behind a holder (TORCH_MODULE), a shared_ptr, a pointer, or the module itself.
template <typename M>
decltype(auto) module_ref(M& m) {
  if constexpr (requires { *m; }) {
    return *m;
  } else {
    return (m);
  }
}

// For each argument, its index among the tensor arguments, or -1.
template <typename... Args>
constexpr std::array<int, sizeof...(Args)> tensor_slots() {
  std::array<int, sizeof...(Args)> slots{};
  int tensors = 0;
  size_t i = 0;
  ((slots[i++] = is_tensor_v<Args> ? tensors++ : -1), ...);
  return slots;
}

template <int Slot, typename A>
decltype(auto) substitute(A& arg, const std::vector<at::Tensor>& tensors) {
  if constexpr (Slot >= 0) {
    return (tensors[static_cast<size_t>(Slot)]);
  } else {
    return (arg);
  }
}

template <typename Module, typename Tuple, size_t... I>
decltype(auto) invoke_forward(Module& m, Tuple& args, const std::vector<at::Tensor>& tensors,
                              std::index_sequence<I...>) {
  constexpr auto slots = tensor_slots<std::tuple_element_t<I, Tuple>...>();
  return m.forward(substitute<slots[I]>(std::get<I>(args), tensors)...);
}

template <typename R>
struct Outputs {
  static_assert(sizeof(R) == 0,
                "zero3::libtorch::call: a unit's forward must return at::Tensor, std::tuple of at::Tensor or "
                "std::vector<at::Tensor>");
};
template <>
struct Outputs<at::Tensor> {
  static std::vector<at::Tensor> flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor unflatten(std::vector<at::Tensor>&& v) { return std::move(v.at(0)); }
};
template <>
struct Outputs<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> flatten(std::vector<at::Tensor> v) { return v; }
  static std::vector<at::Tensor> unflatten(std::vector<at::Tensor>&& v) { return std::move(v); }
};
template <typename... Ts>
struct Outputs<std::tuple<Ts...>> {
  static_assert((is_tensor_v<Ts> && ...), "zero3::libtorch::call: every element of a returned tuple must be a tensor");
  static std::vector<at::Tensor> flatten(std::tuple<Ts...> t) {
    return std::apply([](auto&&... x) { return std::vector<at::Tensor>{std::move(x)...}; }, std::move(t));
  }
  static std::tuple<Ts...> unflatten(std::vector<at::Tensor>&& v) {
    return unflatten_at(std::move(v), std::index_sequence_for<Ts...>{});
  }
  template <size_t... I>
  static std::tuple<Ts...> unflatten_at(std::vector<at::Tensor>&& v, std::index_sequence<I...>) {
    return std::tuple<Ts...>{std::move(v.at(I))...};
  }
};

}  // namespace detail

// Calls `module`'s forward with `args`. When `module` is the model or a unit of a live ShardedModel, the call is
// the unit's (see the contract above); otherwise it is module.forward(args...) and nothing else.
template <typename M, typename... Args>
auto call(M&& module, Args&&... args) {
  auto& m = detail::module_ref(module);
  using Result = std::decay_t<decltype(m.forward(std::forward<Args>(args)...))>;
  const detail::UnitRef unit = detail::find_unit(&m);
  if (!unit) return Result(m.forward(std::forward<Args>(args)...));
  // The arguments are kept (a checkpointed unit runs its forward again in backward).
  auto kept = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  std::apply(
      [&](auto&... a) {
        (
            [&](auto& x) {
              if constexpr (detail::is_tensor_v<decltype(x)>) inputs.push_back(x);
            }(a),
            ...);
      },
      *kept);
  auto* module_ptr = &m;
  detail::ForwardFn forward = [module_ptr, kept](const std::vector<at::Tensor>& tensors) {
    return detail::Outputs<Result>::flatten(
        detail::invoke_forward(*module_ptr, *kept, tensors, std::index_sequence_for<Args...>{}));
  };
  return detail::Outputs<Result>::unflatten(detail::run_unit(unit, std::move(inputs), std::move(forward)));
}

}  // namespace zero3::libtorch

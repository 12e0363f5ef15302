// A call of the model or of a unit, and its backward.
//
// Training forward. The unit's forward scope is opened and its parameter tensors point at the gathered buffer;
// the module's forward runs on detached copies of the input tensors, so that what it records forms a graph of
// its own (the "inner" graph); the scope closes and the parameters are emptied. The call then returns detached
// outputs whose gradient edge is one UnitBackward node. That node's backward opens the unit's backward scope,
// points the parameters again (the leaf tensors and the views autograd saved share their storage, so they see
// the data again), and runs torch::autograd::grad over the inner graph for the inputs and the parameters: the
// parameters' gradients go into the scope's buffer, which the engine reduces when the scope closes, and the
// inputs' gradients flow on through the outer graph. A checkpointed unit keeps no inner graph: its forward runs
// without gradients and its backward runs it again (with the CPU generator's state of the forward) first.
//
// Nested calls (the units inside the model's call, whose parameters form the root unit) record their nodes
// in the enclosing call's inner graph. autograd::grad runs only the nodes on a path to the tensors it is asked
// about, so each nested node also has an edge to an "anchor" of the enclosing call (a scalar leaf that
// enclosing backward asks for): every nested backward runs inside the enclosing one, whose scope is open.
//
// Graph check. After the forward the inner graph is walked. Every leaf that requires gradients must be an
// input, a parameter of this unit or of an enclosing one (the root's tied weights: their gradients leave
// through extra edges of the node and reach the enclosing backward), or the anchor. Anything else (a tensor
// that belongs to no unit, a parameter of a unit not in use, a tensor computed before the call and not passed
// as an argument) would get a wrong or lost gradient, so it is an error naming it.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model_core.hpp"

namespace zero3::libtorch::detail {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

std::string unit_label(const UnitDesc& unit) {
  return unit.root ? "the model (root unit '" + unit.name + "')" : "unit '" + unit.name + "'";
}

// The ShardedModel whose call or unit backward runs on this thread (engine_of_current_call()): backward may run on
// another thread than the forward (libtorch's autograd runs a CUDA graph's nodes on a thread per device).
thread_local ModelCore* calling_core = nullptr;

class CallingCore {
 public:
  explicit CallingCore(ModelCore& core) : previous_(calling_core) { calling_core = &core; }
  ~CallingCore() { calling_core = previous_; }
  CallingCore(const CallingCore&) = delete;
  CallingCore& operator=(const CallingCore&) = delete;

 private:
  ModelCore* previous_;
};

// Counts a call in progress on a unit and, in training, its frame; both undone on any exit.
class OpenCall {
 public:
  OpenCall(ModelCore& core, int unit, bool frame) : core_(core), unit_(unit), frame_(frame) {
    ++core_.units[static_cast<size_t>(unit_)].open;
    if (frame_) core_.frames.push_back(Frame{unit_, {}});
  }
  ~OpenCall() {
    --core_.units[static_cast<size_t>(unit_)].open;
    if (frame_) core_.frames.pop_back();
  }
  OpenCall(const OpenCall&) = delete;
  OpenCall& operator=(const OpenCall&) = delete;

 private:
  ModelCore& core_;
  int unit_;
  bool frame_;
};

// A unit's module called directly (block(x), not call(block, x)) runs on its emptied parameters, and libtorch's error
// ("weight should contain 32 elements not 0") does not say why. Until a training call and an evaluation call of the
// model have completed, an op observer (RecordFunction, thread-local) watches every op's tensor inputs for a parameter of a
// unit that is not in use; the first one seen becomes the error.
thread_local ModelCore* watched_core = nullptr;

void note_idle_use(ModelCore& core, const at::Tensor& t, const char* op) {
  auto it = core.param_by_impl.find(t.unsafeGetTensorImpl());
  if (it == core.param_by_impl.end()) return;
  const UnitDesc& owner = core.units[static_cast<size_t>(core.params[static_cast<size_t>(it->second)].unit)];
  if (owner.open > 0 || owner.root) return;
  int user = 0;  // the innermost call in progress: a unit's, else the model's
  for (size_t u = 1; u < core.units.size(); ++u) {
    if (core.units[u].open > 0) user = static_cast<int>(u);
  }
  core.idle_use = IdleUse{it->second, user, op};
}

std::unique_ptr<at::ObserverContext> watch_op(const at::RecordFunction& fn) {
  ModelCore* core = watched_core;
  if (core == nullptr || core->idle_use.param >= 0) return nullptr;
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      note_idle_use(*core, v.toTensor(), fn.name());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) note_idle_use(*core, t, fn.name());
    }
    if (core->idle_use.param >= 0) break;
  }
  return nullptr;
}

class IdleUseWatch {
 public:
  explicit IdleUseWatch(ModelCore& core) : core_(core), previous_(watched_core) {
    core_.idle_use = IdleUse{};
    watched_core = &core_;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&watch_op).needsInputs(true));
  }
  ~IdleUseWatch() {
    at::removeCallback(handle_);
    watched_core = previous_;
  }
  IdleUseWatch(const IdleUseWatch&) = delete;
  IdleUseWatch& operator=(const IdleUseWatch&) = delete;

 private:
  ModelCore& core_;
  ModelCore* previous_;
  at::CallbackHandle handle_;
};

[[noreturn]] void throw_idle_use(const ModelCore& core, const std::string& torch_error) {
  const TorchParam& p = core.params[static_cast<size_t>(core.idle_use.param)];
  const std::string& owner = core.units[static_cast<size_t>(p.unit)].name;
  throw InvalidArgument("zero3::libtorch: " + unit_label(core.units[static_cast<size_t>(core.idle_use.user)]) +
                        " used " + core.describe_param(core.idle_use.param) + ", whose unit is not in use: " +
                        core.idle_use.op + " saw the parameter empty" +
                        (torch_error.empty() ? "" : " (libtorch: " + torch_error + ")") + ". A unit called directly, " +
                        owner + "(x) or " + owner + "->forward(x), does this: call it through zero3::libtorch::call(" +
                        owner + ", x). Using another unit's parameter does too: put the modules that use it in one "
                        "unit, or tie it so that it belongs to the root");
}

// Runs a call's forward; libtorch's error from an op on an idle unit's parameter becomes the error above.
std::vector<at::Tensor> run_forward(const ModelCore& core, const ForwardFn& forward,
                                    const std::vector<at::Tensor>& inputs) {
  try {
    return forward(inputs);
  } catch (const c10::Error& e) {
    if (core.idle_use.param < 0) throw;
    std::string what = e.what_without_backtrace();
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw_idle_use(core, what);
  }
}

void check_outputs_alias_no_parameter(const ModelCore& core, const UnitDesc& unit, const std::vector<at::Tensor>& outs) {
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !outs[k].has_storage()) continue;
    const c10::StorageImpl* storage = outs[k].storage().unsafeGetStorageImpl();
    for (int i : unit.params) {
      const TorchParam& p = core.params[static_cast<size_t>(i)];
      if (p.tensor.storage().unsafeGetStorageImpl() == storage) {
        throw InvalidArgument("zero3::libtorch: " + unit_label(unit) + " returned, as output " + std::to_string(k) +
                              ", a view of its parameter '" + p.name +
                              "', which is emptied when the call ends: return a copy (clone()) instead");
      }
    }
  }
}

// What the walk of an inner graph found besides the inputs and the unit's own parameters.
struct GraphUses {
  std::vector<int> foreign;  // parameters of enclosing units in use (indices into ModelCore::params)
};

GraphUses check_graph(const ModelCore& core, int unit_index, const std::vector<at::Tensor>& outputs,
                      const std::vector<at::Tensor>& inner_inputs, const at::Tensor& anchor, uint64_t first_seq) {
  const UnitDesc& unit = core.units[static_cast<size_t>(unit_index)];
  std::unordered_set<const c10::TensorImpl*> inputs;
  for (const at::Tensor& t : inner_inputs) {
    if (t.defined()) inputs.insert(t.unsafeGetTensorImpl());
  }
  if (anchor.defined()) inputs.insert(anchor.unsafeGetTensorImpl());
  GraphUses uses;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> todo;
  for (const at::Tensor& o : outputs) {
    if (o.defined() && o.grad_fn()) todo.push_back(o.grad_fn().get());
  }
  while (!todo.empty()) {
    Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      const c10::TensorImpl* impl = acc->variable.unsafeGetTensorImpl();
      if (inputs.count(impl)) continue;
      auto it = core.param_by_impl.find(impl);
      if (it == core.param_by_impl.end()) {
        throw InvalidArgument(
            "zero3::libtorch: " + unit_label(unit) + " used a tensor of shape " + c10::str(acc->variable.sizes()) +
            " that requires gradients but belongs to no unit: it is neither an argument of call() nor a parameter "
            "registered in the model (register it with register_parameter() before wrapping, or pass it as an "
            "argument of call())");
      }
      const TorchParam& p = core.params[static_cast<size_t>(it->second)];
      if (p.unit == unit_index) continue;
      if (!core.is_open_in_forward(p.unit)) {
        throw InvalidArgument("zero3::libtorch: " + unit_label(unit) + " used " + core.describe_param(it->second) +
                              ", whose unit is not in use: a parameter is gathered only inside its own unit's call; "
                              "put the modules that use it in one unit, or tie it so that it belongs to the root");
      }
      if (unit.checkpoint) {
        throw InvalidArgument("zero3::libtorch: checkpointed " + unit_label(unit) + " used " +
                              core.describe_param(it->second) +
                              ", a parameter of the call around it: a checkpointed unit may use only its own "
                              "parameters; do not checkpoint it");
      }
      bool known = false;
      for (int f : uses.foreign) known = known || f == it->second;
      if (!known) uses.foreign.push_back(it->second);
      continue;
    }
    if (node->sequence_nr() < first_seq) {
      throw InvalidArgument("zero3::libtorch: " + unit_label(unit) +
                            " used a tensor that requires gradients and was computed before the call (its gradient "
                            "function is " + node->name() +
                            ") without being an argument of call(): pass it as an argument. A tensor kept from a "
                            "parameter outside its unit (a transpose made in a constructor) cannot be used: "
                            "compute it inside the forward");
    }
    for (const torch::autograd::Edge& e : node->next_edges()) {
      if (e.function) todo.push_back(e.function.get());
    }
  }
  return uses;
}

// A new autograd node: libtorch holds nodes by std::shared_ptr up to 2.x releases that moved to c10::intrusive_ptr.
template <typename T, typename... Args>
auto make_node(Args&&... args) {
  using NodePtr = std::decay_t<decltype(std::declval<torch::autograd::Edge>().function)>;
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// The anchor of the innermost call around the current one that records a node, made on first use; undefined when
// there is none.
at::Tensor enclosing_anchor(ModelCore& core) {
  for (size_t k = core.frames.size(); k-- > 1;) {  // the last frame is the current call
    Frame& f = core.frames[k - 1];
    if (!core.units[static_cast<size_t>(f.unit)].id.valid()) continue;
    if (!f.anchor.defined()) f.anchor = at::zeros({}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
    return f.anchor;
  }
  return at::Tensor();
}

class UnitBackward : public Node {
 public:
  UnitBackward(std::weak_ptr<ModelCore> core, int unit, int64_t micro_step)
      : core_(std::move(core)), unit_(unit), micro_step_(micro_step) {}

  std::string name() const override { return "zero3::libtorch::UnitBackward"; }

  // Filled by the forward.
  std::vector<at::Tensor> inner_inputs;   // the detached inputs (a checkpointed unit: its saved inputs)
  std::vector<char> input_has_edge;       // which inputs require gradients (each has an edge, in order)
  std::vector<at::Tensor> inner_outputs;  // per output slot (not for a checkpointed unit)
  std::vector<size_t> slot_output;        // the output index of each slot
  std::vector<int> foreign;               // enclosing units' parameters: one edge each, after the inputs'
  at::Tensor anchor;                      // this call's anchor, when nested calls recorded nodes
  ForwardFn forward;                      // checkpointed units
  RngStates rng_state;                    // checkpointed units

  variable_list apply(variable_list&& grads) override {
    std::shared_ptr<ModelCore> core = core_.lock();
    if (!core) {
      throw InvalidArgument(
          "zero3::libtorch: backward reached a unit of a ShardedModel that no longer exists: keep the ShardedModel "
          "alive until every backward has run");
    }
    UnitDesc& unit = core->units[static_cast<size_t>(unit_)];
    Engine& engine = core->engine;
    if (done_) {
      throw InvalidArgument("zero3::libtorch: a second backward through " + unit_label(unit) +
                            " of the same forward (retain_graph): each forward of a sharded model has one backward");
    }
    if (engine.micro_steps() != micro_step_) {
      throw InvalidArgument("zero3::libtorch: the backward of " + unit_label(unit) + " runs in micro-step " +
                            std::to_string(engine.micro_steps()) + " but its forward ran in micro-step " +
                            std::to_string(micro_step_) + ": call backward before step()");
    }
    if (at::GradMode::is_enabled()) {
      throw Unsupported("zero3::libtorch: backward with create_graph through " + unit_label(unit) +
                        " (higher-order gradients) is not supported");
    }
    if (engine.loss_scale() != 1.0 && !core->in_scaled_backward) {
      throw InvalidArgument("zero3::libtorch: fp16 loss scaling is on (scale " + std::to_string(engine.loss_scale()) +
                            "): run the backward with ShardedModel::backward(loss), which multiplies the loss by the "
                            "scale, not loss.backward()");
    }
    done_ = true;
    core->backward_micro_step = micro_step_;
    CallingCore calling(*core);

    std::vector<at::Tensor> outs, grad_outs;
    std::vector<size_t> live_slots;
    for (size_t s = 0; s < grads.size(); ++s) {
      if (grads[s].defined()) live_slots.push_back(s);
    }
    variable_list result(num_outputs());
    if (live_slots.empty()) {
      release_variables();
      return result;
    }

    std::vector<at::Tensor> wrt;  // inputs with edges, own parameters, foreign parameters, anchor
    std::vector<at::Tensor> x_in = inner_inputs;
    {
      UnitScope scope = engine.backward_scope(unit.id);
      {
        PointedUnit pointed(*core, unit, scope);
        // The forward already updated the unit's running statistics: the recomputation's update is undone, after the
        // gradients (batch norm's backward checks that the statistics it saved were not changed in place).
        std::optional<KeptBuffers> kept_buffers;
        if (unit.checkpoint) kept_buffers.emplace(*unit.module);
        if (unit.checkpoint) {
          OpenCall open(*core, unit_, /*frame=*/false);
          for (size_t i = 0; i < x_in.size(); ++i) {
            if (x_in[i].defined()) {
              x_in[i] = x_in[i].detach();
              if (input_has_edge[i]) x_in[i].requires_grad_(true);
            }
          }
          const RngStates current_rng = core->rng_states();
          core->set_rng_states(rng_state);
          const uint64_t first_seq = at::sequence_number::peek();
          std::vector<at::Tensor> recomputed;
          try {
            at::AutoGradMode grad_on(true);
            recomputed = run_forward(*core, forward, x_in);
          } catch (...) {
            core->set_rng_states(current_rng);
            throw;
          }
          core->set_rng_states(current_rng);
          check_graph(*core, unit_, recomputed, x_in, at::Tensor(), first_seq);
          for (size_t s : live_slots) {
            const at::Tensor& o = recomputed.at(slot_output[s]);
            if (o.requires_grad()) {
              outs.push_back(o);
              grad_outs.push_back(grads[s]);
            }
          }
        } else {
          for (size_t s : live_slots) {
            outs.push_back(inner_outputs[s]);
            grad_outs.push_back(grads[s]);
          }
        }
        for (size_t i = 0; i < x_in.size(); ++i) {
          if (input_has_edge[i]) wrt.push_back(x_in[i]);
        }
        for (int i : unit.params) wrt.push_back(core->params[static_cast<size_t>(i)].tensor);
        for (int i : foreign) wrt.push_back(core->params[static_cast<size_t>(i)].tensor);
        if (anchor.defined()) wrt.push_back(anchor);
        variable_list got;
        if (!outs.empty()) {
          got = torch::autograd::grad(outs, wrt, grad_outs, /*retain_graph=*/false, /*create_graph=*/false,
                                      /*allow_unused=*/true);
        } else {
          got.resize(wrt.size());
        }
        size_t k = 0;
        for (size_t i = 0; i < x_in.size(); ++i) {
          if (input_has_edge[i]) result[k] = got[k], ++k;
        }
        const size_t inputs_with_edges = k;
        const at::TensorOptions grad_options = at::TensorOptions().dtype(core->grad_type).device(core->device);
        for (int i : unit.params) {
          const at::Tensor& g = got[k++];
          if (!g.defined()) continue;  // not used by this call: a zero gradient
          const TorchParam& p = core->params[static_cast<size_t>(i)];
          // The device given: from_blob would otherwise ask CUDA where the pointer lives.
          at::for_blob(scope.grad(p.id).data, p.shape)
              .options(grad_options)
              .target_device(core->device)
              .make_tensor()
              .add_(g);
        }
        for (size_t f = 0; f < foreign.size(); ++f) result[inputs_with_edges + f] = got[k++];
        kept_buffers.reset();
        pointed.release();
      }
      scope.close();
    }
    release_variables();
    return result;
  }

  void release_variables() override {
    inner_inputs.clear();
    inner_outputs.clear();
    forward = nullptr;
    rng_state = RngStates{};
    anchor = at::Tensor();
  }

 private:
  std::weak_ptr<ModelCore> core_;
  int unit_;
  int64_t micro_step_;
  bool done_ = false;
};

std::vector<at::Tensor> run_evaluation(ModelCore& core, int unit_index, const std::vector<at::Tensor>& inputs,
                                       const ForwardFn& forward) {
  const UnitDesc& unit = core.units[static_cast<size_t>(unit_index)];
  OpenCall open(core, unit_index, /*frame=*/false);
  at::NoGradGuard no_grad;
  if (!unit.id.valid()) return run_forward(core, forward, inputs);
  std::vector<at::Tensor> outputs;
  UnitScope scope = core.engine.forward_scope(unit.id);
  {
    PointedUnit pointed(core, unit, scope);
    outputs = run_forward(core, forward, inputs);
    check_outputs_alias_no_parameter(core, unit, outputs);
    pointed.release();
  }
  scope.close();
  return outputs;
}

std::vector<at::Tensor> run_training(ModelCore& core, int unit_index, const std::vector<at::Tensor>& inputs,
                                     ForwardFn forward) {
  const UnitDesc& unit = core.units[static_cast<size_t>(unit_index)];
  if (!unit.id.valid()) {  // no parameters: nothing to gather, the forward records into the enclosing graph
    OpenCall open(core, unit_index, /*frame=*/true);
    return run_forward(core, forward, inputs);
  }
  std::vector<at::Tensor> inner(inputs.size());
  std::vector<char> has_edge(inputs.size(), 0);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    inner[i] = inputs[i].detach();
    if (inputs[i].requires_grad()) {
      inner[i].requires_grad_(true);
      has_edge[i] = 1;
    }
  }
  RngStates rng_state;
  if (unit.checkpoint) rng_state = core.rng_states();

  std::vector<at::Tensor> outputs;
  at::Tensor anchor, enclosing;
  GraphUses uses;
  {
    OpenCall open(core, unit_index, /*frame=*/true);
    const uint64_t first_seq = at::sequence_number::peek();
    UnitScope scope = core.engine.forward_scope(unit.id);
    {
      PointedUnit pointed(core, unit, scope);
      if (unit.checkpoint) {
        at::NoGradGuard no_grad;
        outputs = run_forward(core, forward, inner);
      } else {
        outputs = run_forward(core, forward, inner);
      }
      check_outputs_alias_no_parameter(core, unit, outputs);
      pointed.release();
    }
    scope.close();
    anchor = core.frames.back().anchor;
    if (!unit.checkpoint) uses = check_graph(core, unit_index, outputs, inner, anchor, first_seq);
    enclosing = enclosing_anchor(core);
  }

  auto node = make_node<UnitBackward>(core.weak_from_this(), unit_index, core.engine.micro_steps());
  std::vector<at::Tensor> edge_tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (has_edge[i]) edge_tensors.push_back(inputs[i]);
  }
  for (int f : uses.foreign) edge_tensors.push_back(core.params[static_cast<size_t>(f)].tensor);
  if (enclosing.defined()) edge_tensors.push_back(enclosing);  // its gradient stays undefined
  node->set_next_edges(torch::autograd::collect_next_edges(edge_tensors));
  node->input_has_edge = std::move(has_edge);
  node->foreign = std::move(uses.foreign);
  node->anchor = std::move(anchor);
  node->inner_inputs = std::move(inner);
  if (unit.checkpoint) {
    node->forward = std::move(forward);
    node->rng_state = std::move(rng_state);
  }

  std::vector<at::Tensor> result(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& o = outputs[k];
    const bool differentiable =
        o.defined() && (at::isFloatingType(o.scalar_type()) || at::isComplexType(o.scalar_type())) &&
        (unit.checkpoint || o.requires_grad());
    if (!differentiable) {
      result[k] = o;
      continue;
    }
    result[k] = o.detach();
    torch::autograd::create_gradient_edge(result[k], node);
    node->slot_output.push_back(k);
    if (!unit.checkpoint) node->inner_outputs.push_back(o);
  }
  return result;
}

}  // namespace

// The CPU generator's state: restored for a checkpointed unit's recomputation and put back afterwards, and for a
// unit factory's second run.
at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RngStates ModelCore::rng_states() const {
  RngStates states{cpu_rng_state(), at::Tensor()};
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.device = gen.get_state();
  }
  return states;
}

void ModelCore::set_rng_states(const RngStates& states) const {
  set_cpu_rng_state(states.cpu);
  if (states.device.defined()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(states.device);
  }
}

Engine* engine_of_current_call() { return calling_core == nullptr ? nullptr : &calling_core->engine; }

std::vector<at::Tensor> run_unit(UnitRef ref, std::vector<at::Tensor> inputs, ForwardFn forward) {
  ModelCore& core = *ref.core;
  const UnitDesc& unit = core.units[static_cast<size_t>(ref.unit)];
  Engine& engine = core.engine;
  if (!core.materialized) {
    throw InvalidArgument("zero3::libtorch: " + unit_label(unit) +
                          " called before ShardedModel::materialize() (its parameters are not in the engine yet)");
  }
  const bool evaluating = engine.evaluating();
  if (unit.open > 0) {
    throw InvalidArgument("zero3::libtorch: " + unit_label(unit) +
                          " called inside its own call: a unit is called once at a time (to use a module twice, "
                          "call it twice one after the other)");
  }
  if (unit.root) {
    if (!evaluating && engine.micro_steps() == core.backward_micro_step) {
      throw InvalidArgument(
          "zero3::libtorch: the model is called again after the backward of micro-step " +
          std::to_string(engine.micro_steps()) +
          " without step(): the optimizer of a sharded model is zero3's (the DeepSpeed config's \"optimizer\"), "
          "called by ShardedModel::step() after every backward; torch::optim sees only empty parameters without "
          "gradients and does nothing");
    }
  } else if (core.units[0].open == 0) {
    throw InvalidArgument("zero3::libtorch: " + unit_label(unit) +
                          " called outside the model's call: call the model through zero3::libtorch::call(model, "
                          "...) so that its units are called inside it");
  }
  if (!core.frames.empty() && core.units[static_cast<size_t>(core.frames.back().unit)].checkpoint) {
    throw InvalidArgument("zero3::libtorch: " + unit_label(unit) + " called inside checkpointed unit '" +
                          core.units[static_cast<size_t>(core.frames.back().unit)].name +
                          "': checkpoint only units that call no other unit");
  }
  if (!evaluating && !at::GradMode::is_enabled()) {
    throw InvalidArgument("zero3::libtorch: " + unit_label(unit) +
                          " called with gradients off (torch::NoGradGuard) outside evaluation: a forward without "
                          "gradients runs inside ShardedModel::evaluate(), which keeps it out of the training "
                          "schedule");
  }
  core.check_unchanged(unit);
  if (unit.root) apply_loaded_buffers(core);
  CallingCore calling(core);
  bool& watch = evaluating ? core.watch_evaluation : core.watch_training;
  if (unit.root && watch) {
    std::vector<at::Tensor> outputs;
    {
      IdleUseWatch watching(core);
      outputs = evaluating ? run_evaluation(core, ref.unit, inputs, forward)
                           : run_training(core, ref.unit, inputs, std::move(forward));
    }
    if (core.idle_use.param >= 0) throw_idle_use(core, "");  // an op that accepted the empty parameter
    watch = false;  // a call completed without touching an idle unit's parameter
    return outputs;
  }
  if (evaluating) return run_evaluation(core, ref.unit, inputs, forward);
  return run_training(core, ref.unit, inputs, std::move(forward));
}

}  // namespace zero3::libtorch::detail

// Wrapping a torch::nn model: its units and parameters declared to the engine, the parameter tensors' storage
// pointed at the engine's gathered buffers while their unit is in use and emptied otherwise, and the queries.
#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "model_core.hpp"
#include "zero3/log.hpp"

namespace zero3::libtorch::detail {

namespace {

// Which ModelCore unit each wrapped module is. Calls look their module up here.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, UnitRef> units;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& items, size_t limit = 12) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

bool inside(const std::string& name, const std::string& path) {
  return name.size() > path.size() && name.compare(0, path.size(), path) == 0 && name[path.size()] == '.';
}

bool has_gradient_hook(const at::Tensor& t) {
  if (!torch::autograd::impl::hooks(t).empty()) return true;
#if TORCH_VERSION_MAJOR >= 2
  if (torch::autograd::impl::post_acc_grad_hooks(t)) return true;
#endif
  return false;
}

std::vector<std::pair<std::string, const c10::TensorImpl*>> registered_params(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, const c10::TensorImpl*>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value().unsafeGetTensorImpl());
  }
  return out;
}

}  // namespace

at::ScalarType scalar_type_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return at::kFloat;
    case DType::bf16:
      return at::kBFloat16;
    case DType::f16:
      return at::kHalf;
  }
  return at::kFloat;
}

UnitRef find_unit(const torch::nn::Module* module) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.units.find(module);
  return it == r.units.end() ? UnitRef{} : it->second;
}

ModelCore::ModelCore(Engine& engine_, std::shared_ptr<torch::nn::Module> model_, WrapOptions options_,
                     std::shared_ptr<UnitRebuilder> rebuilder_)
    : engine(engine_), model(std::move(model_)), options(std::move(options_)), rebuilder(std::move(rebuilder_)) {
  if (!model) throw InvalidArgument("zero3::libtorch::ShardedModel: the model is null");
  if (engine.materialized()) {
    throw InvalidArgument("zero3::libtorch::ShardedModel: the engine is already materialized; wrap the model on a "
                          "fresh engine (the model's parameters are declared to it)");
  }
  // On a cuda engine the parameters are views of its device memory, in torch's order of work (stream_order.hpp).
  check_torch_device(engine.device());
  if (engine.device().type() == DeviceType::cuda) {
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(engine.device().index()));
    streams = std::make_unique<StreamOrder>(engine.device());
  }
  compute_type = scalar_type_of(engine.compute_dtype());
  grad_type = scalar_type_of(engine.grad_dtype());

  // The units, by path.
  std::map<std::string, std::shared_ptr<torch::nn::Module>> submodules;
  std::vector<std::string> order;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    submodules[item.key()] = item.value();
    order.push_back(item.key());
  }
  std::set<std::string> wanted;
  for (const std::string& path : options.units) {
    if (!submodules.count(path)) {
      std::vector<std::string> children;
      for (const auto& item : model->named_children()) children.push_back(item.key());
      throw InvalidArgument("zero3::libtorch::ShardedModel: unit '" + path + "' is not a submodule of the model (" +
                            "paths as named_modules() spells them; its children are: " + join(children) + ")");
    }
    if (!wanted.insert(path).second) {
      throw InvalidArgument("zero3::libtorch::ShardedModel: unit '" + path + "' is named twice in WrapOptions::units");
    }
    if (path == options.root_unit) {
      throw InvalidArgument("zero3::libtorch::ShardedModel: unit '" + path +
                            "' has the root unit's name (WrapOptions::root_unit): choose another root_unit");
    }
  }
  for (const std::string& a : wanted) {
    for (const std::string& b : wanted) {
      if (inside(b, a)) {
        throw InvalidArgument("zero3::libtorch::ShardedModel: unit '" + b + "' lies inside unit '" + a +
                              "': units may not nest (name either the module or its parts)");
      }
    }
  }
  std::set<std::string> checkpointed;
  for (const std::string& path : options.checkpoint) {
    if (!wanted.count(path)) {
      throw InvalidArgument("zero3::libtorch::ShardedModel: WrapOptions::checkpoint names '" + path +
                            "', which is not one of WrapOptions::units (only units are checkpointed)");
    }
    checkpointed.insert(path);
  }

  UnitDesc root;
  root.name = options.root_unit;
  root.module = model.get();
  root.root = true;
  root.registered = registered_params(*model);
  units.push_back(std::move(root));
  for (const std::string& path : order) {
    if (!wanted.count(path)) continue;
    UnitDesc u;
    u.name = path;
    u.path = path;
    u.module = submodules[path].get();
    u.checkpoint = checkpointed.count(path) > 0;
    u.registered = registered_params(*u.module);
    units.push_back(std::move(u));
  }

  // The parameters, each in the unit whose path holds its name; one shared by two units in the root.
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const at::Tensor& t = item.value();
    int owner = 0;
    for (size_t u = 1; u < units.size(); ++u) {
      if (inside(name, units[u].path)) owner = static_cast<int>(u);
    }
    auto seen = param_by_impl.find(t.unsafeGetTensorImpl());
    if (seen != param_by_impl.end()) {
      TorchParam& p = params[static_cast<size_t>(seen->second)];
      p.also.push_back(name);
      if (p.unit != owner && p.unit != 0) {
        log::info("zero3::libtorch: parameter '", p.name, "' is also '", name, "' in unit '",
                  units[static_cast<size_t>(owner)].name, "': shared by two units, it belongs to the root unit '",
                  options.root_unit, "'");
        p.unit = 0;
      }
      continue;
    }
    const std::string what = "zero3::libtorch::ShardedModel: parameter '" + name + "'";
    if (!t.is_leaf()) {
      throw InvalidArgument(what + " is not a leaf tensor (it was computed from another tensor); register the "
                                   "tensor that is trained");
    }
    if (!t.requires_grad()) {
      throw InvalidArgument(what + " does not require gradients: frozen parameters are not supported (every "
                                   "parameter is stepped by zero3's optimizer); keep fixed tensors as buffers "
                                   "(register_buffer)");
    }
    if (t.layout() != at::kStrided) throw InvalidArgument(what + " is not a dense (strided) tensor");
    if (t.numel() == 0) throw InvalidArgument(what + " has no elements (shape " + c10::str(t.sizes()) + ")");
    if (t.scalar_type() != compute_type) {
      throw InvalidArgument(what + " is " + std::string(c10::toString(t.scalar_type())) +
                            " but the engine computes in " + std::string(dtype_name(engine.compute_dtype())) +
                            " (the config's bf16/fp16 sections): convert the model with model->to() before wrapping");
    }
    if (t.device() != device) {
      throw InvalidArgument(what + " is on " + t.device().str() + " but the engine's device is " +
                            engine.device().name() + ": move the model with model->to() before wrapping");
    }
    TorchParam p;
    p.name = name;
    p.tensor = t;
    p.shape = t.sizes().vec();
    p.unit = owner;
    p.init = std::make_shared<InitSource>();
    const int factory = rebuilder ? rebuilder->factory_of(name) : -1;
    if (factory >= 0) {  // its storage is freed: the factory is run again in materialize()
      p.init->rebuild = rebuilder;
      p.init->factory = factory;
      p.init->local = name.substr(rebuilder->factories[static_cast<size_t>(factory)].path.size() + 1);
    } else {
      p.init->values = t.detach().contiguous().view({-1});
    }
    param_by_impl[t.unsafeGetTensorImpl()] = static_cast<int>(params.size());
    params.push_back(std::move(p));
  }
  for (size_t i = 0; i < params.size(); ++i) units[static_cast<size_t>(params[i].unit)].params.push_back(static_cast<int>(i));
  // A checkpointed unit recomputes its forward inside its own backward scope, where only its own parameters are
  // gathered: a parameter it shares with another unit (a tied weight, which belongs to the root) cannot be used there.
  for (const UnitDesc& u : units) {
    if (!u.checkpoint) continue;
    for (const auto& item : u.module->named_parameters(/*recurse=*/true)) {
      const TorchParam& p = params[static_cast<size_t>(param_by_impl.at(item.value().unsafeGetTensorImpl()))];
      if (p.unit == static_cast<int>(&u - units.data())) continue;
      std::string names = "'" + p.name + "'";
      for (const std::string& other : p.also) names += " and '" + other + "'";
      throw InvalidArgument("zero3::libtorch::ShardedModel: checkpointed unit '" + u.name + "' uses parameter '" +
                            u.path + "." + item.key() + "', which is registered as " + names +
                            " and so belongs to " +
                            (units[static_cast<size_t>(p.unit)].root ? "the root unit '" : "unit '") +
                            units[static_cast<size_t>(p.unit)].name +
                            "' (a parameter shared by two units, a tied weight, belongs to the root): a checkpointed "
                            "unit recomputes its forward with only its own parameters gathered. Do not checkpoint '" +
                            u.name + "' (WrapOptions::checkpoint), or untie the weight");
    }
  }

  for (UnitDesc& u : units) {
    if (u.params.empty()) continue;
    u.id = engine.add_unit(u.name);
    for (int i : u.params) {
      TorchParam& p = params[static_cast<size_t>(i)];
      std::shared_ptr<InitSource> source = p.init;
      const std::string name = p.name;
      ParamInit init = ParamInit::from_reader([source, name](int64_t begin, int64_t end, float* out) {
        if (source->rebuild) {
          source->rebuild->read(source->factory, source->local, begin, end, out);
          return;
        }
        if (!source->values.defined()) {
          throw InvalidArgument("zero3::libtorch: the initial values of parameter '" + name +
                                "' were released when the model was materialized");
        }
        at::Tensor part = source->values.slice(0, begin, end).to(at::kCPU, at::kFloat).contiguous();
        std::memcpy(out, part.data_ptr<float>(), static_cast<size_t>(end - begin) * sizeof(float));
      });
      p.id = engine.add_param(u.id, ParamSpec(p.name, p.shape, std::move(init)));
    }
  }

  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (size_t u = 0; u < units.size(); ++u) {
    if (r.units.count(units[u].module)) {
      throw InvalidArgument("zero3::libtorch::ShardedModel: module '" + (units[u].root ? "<model>" : units[u].path) +
                            "' is already wrapped by another ShardedModel");
    }
  }
  for (size_t u = 0; u < units.size(); ++u) r.units[units[u].module] = UnitRef{this, static_cast<int>(u)};
}

ModelCore::~ModelCore() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const UnitDesc& u : units) {
    auto it = r.units.find(u.module);
    if (it != r.units.end() && it->second.core == this) r.units.erase(it);
  }
}

void ModelCore::point(const UnitDesc& unit, const UnitScope& scope) {
  for (int i : unit.params) {
    const TorchParam& p = params[static_cast<size_t>(i)];
    const TensorView v = scope.param(p.id);
    c10::TensorImpl* impl = p.tensor.unsafeGetTensorImpl();
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(v.data, device));
    storage->set_nbytes(v.bytes());
    impl->set_sizes_contiguous(p.shape);
  }
}

PointedUnit::PointedUnit(ModelCore& core, const UnitDesc& unit, const UnitScope& scope) : core_(core), unit_(unit) {
  core_.point(unit_, scope);
  if (!core_.streams) return;
  try {
    core_.streams->torch_after_engine();
  } catch (...) {
    core_.empty(unit_);
    throw;
  }
}

void PointedUnit::release() {
  if (released_) return;
  released_ = true;
  struct Emptied {
    ModelCore& core;
    const UnitDesc& unit;
    ~Emptied() { core.empty(unit); }
  } emptied{core_, unit_};
  if (core_.streams) core_.streams->engine_after_torch();
}

PointedUnit::~PointedUnit() {
  try {
    release();
  } catch (const std::exception& e) {  // already leaving by an exception: the scope's own error is the one to see
    log::error("zero3::libtorch: ordering the engine's stream after torch's for unit '", unit_.name,
               "' failed: ", e.what());
  }
}

void ModelCore::empty(const UnitDesc& unit) {
  for (int i : unit.params) {
    c10::TensorImpl* impl = params[static_cast<size_t>(i)].tensor.unsafeGetTensorImpl();
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, device));
    storage->set_nbytes(size_t{0});
    impl->set_sizes_contiguous({0});
  }
}

void ModelCore::check_unchanged(const UnitDesc& unit) const {
  const std::string module = unit.root ? "the model" : "unit '" + unit.name + "'";
  auto now = unit.module->named_parameters(/*recurse=*/true);
  size_t k = 0;
  for (const auto& item : now) {
    if (k >= unit.registered.size() || unit.registered[k].first != item.key() ||
        unit.registered[k].second != item.value().unsafeGetTensorImpl()) {
      throw InvalidArgument("zero3::libtorch: " + module + " was changed after wrapping: its parameter '" +
                            item.key() + "' is not the tensor the ShardedModel wrapped (replaced or added); build the "
                            "model completely, then wrap it");
    }
    ++k;
  }
  if (k != unit.registered.size()) {
    throw InvalidArgument("zero3::libtorch: " + module + " was changed after wrapping: parameter '" +
                          unit.registered[k].first + "' is gone; build the model completely, then wrap it");
  }
  for (int i : unit.params) {
    const TorchParam& p = params[static_cast<size_t>(i)];
    if (!p.tensor.requires_grad()) {
      throw InvalidArgument("zero3::libtorch: parameter '" + p.name +
                            "' stopped requiring gradients after wrapping: frozen parameters are not supported");
    }
    if (has_gradient_hook(p.tensor)) {
      throw InvalidArgument("zero3::libtorch: parameter '" + p.name +
                            "' has a gradient hook (register_hook): zero3 computes a sharded parameter's gradient "
                            "inside its unit's backward and reduce-scatters it, so the hook would run on an "
                            "emptied parameter or not see the gradient zero3 applies. Remove the hook; change the "
                            "gradient through the loss, or hook an activation instead");
    }
  }
}

bool ModelCore::is_open_in_forward(int unit) const {
  for (const Frame& f : frames) {
    if (f.unit == unit) return true;
  }
  return false;
}

std::string ModelCore::describe_param(int index) const {
  const TorchParam& p = params[static_cast<size_t>(index)];
  return "parameter '" + p.name + "' of unit '" + units[static_cast<size_t>(p.unit)].name + "'";
}

}  // namespace zero3::libtorch::detail

namespace zero3::libtorch {

using detail::ModelCore;

ShardedModel::ShardedModel(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options)
    : core_(std::make_shared<ModelCore>(engine, std::move(model), std::move(options))) {
  detail::register_buffers(*core_);
}

ShardedModel::ShardedModel(Engine& engine, std::shared_ptr<torch::nn::Module> model, WrapOptions options,
                           std::vector<UnitFactory> factories) {
  if (!model) throw InvalidArgument("zero3::libtorch::ShardedModel: the model is null");
  auto rebuilder = std::make_shared<detail::UnitRebuilder>();
  rebuilder->factories = std::move(factories);
  for (const UnitFactory& f : rebuilder->factories) {
    if (std::find(options.units.begin(), options.units.end(), f.path) == options.units.end()) {
      options.units.push_back(f.path);
    }
  }
  rebuilder->build_all(*model);
  core_ = std::make_shared<ModelCore>(engine, std::move(model), std::move(options), std::move(rebuilder));
  detail::register_buffers(*core_);
}

ShardedModel::~ShardedModel() = default;

void ShardedModel::materialize() {
  ModelCore& c = *core_;
  if (c.materialized) throw InvalidArgument("zero3::libtorch::ShardedModel::materialize: already materialized");
  if (c.rebuilder) {
    try {
      c.engine.materialize();
    } catch (...) {
      c.rebuilder->finish();
      throw;
    }
    c.rebuilder->finish();
  } else {
    c.engine.materialize();
  }
  c.rebuilder.reset();  // the factories and what they hold
  for (detail::TorchParam& p : c.params) {
    p.init->values = at::Tensor();
    p.init->rebuild.reset();
    c10::TensorImpl* impl = p.tensor.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(
        c10::Storage(c10::Storage::use_byte_size_t(), size_t{0}, c10::DataPtr(nullptr, c.device), nullptr, false));
    impl->set_storage_offset(0);
    impl->set_sizes_contiguous({0});
  }
  c.materialized = true;
  detail::sync_buffers(c, BufferSync::broadcast);  // the same start on every rank, whatever each rank built
}

void ShardedModel::backward(const at::Tensor& loss) {
  ModelCore& c = *core_;
  const double scale = c.engine.loss_scale();
  c.in_scaled_backward = true;
  try {
    if (scale != 1.0) {
      (loss * scale).backward();
    } else {
      loss.backward();
    }
  } catch (...) {
    c.in_scaled_backward = false;
    throw;
  }
  c.in_scaled_backward = false;
}

StepResult ShardedModel::step() {
  ModelCore& c = *core_;
  if (!c.frames.empty()) {
    throw InvalidArgument("zero3::libtorch::ShardedModel::step: called inside a call of unit '" +
                          c.units[static_cast<size_t>(c.frames.back().unit)].name + "'");
  }
  StepResult result = c.engine.step();
  detail::sync_buffers(c, c.options.buffer_sync);
  return result;
}

void ShardedModel::sync_buffers() {
  ModelCore& c = *core_;
  if (!c.frames.empty()) {
    throw InvalidArgument("zero3::libtorch::ShardedModel::sync_buffers: called inside a call of unit '" +
                          c.units[static_cast<size_t>(c.frames.back().unit)].name + "'");
  }
  detail::sync_buffers(c, c.options.buffer_sync);
}

std::vector<std::string> ShardedModel::buffer_names() const {
  std::vector<std::string> out;
  for (const detail::NamedBuffer& b : detail::model_buffers(*core_->model)) out.push_back(b.name);
  return out;
}

EvalMode ShardedModel::evaluate() { return core_->engine.evaluate(); }

Engine& ShardedModel::engine() const { return core_->engine; }

const std::shared_ptr<torch::nn::Module>& ShardedModel::module() const { return core_->model; }

std::vector<std::string> ShardedModel::unit_names() const {
  std::vector<std::string> out;
  for (const detail::UnitDesc& u : core_->units) {
    if (u.id.valid()) out.push_back(u.name);
  }
  return out;
}

UnitId ShardedModel::unit_of(const std::string& name) const {
  const ModelCore& c = *core_;
  for (const auto& item : c.model->named_parameters(/*recurse=*/true)) {
    if (item.key() != name) continue;
    auto it = c.param_by_impl.find(item.value().unsafeGetTensorImpl());
    if (it != c.param_by_impl.end()) return c.units[static_cast<size_t>(c.params[static_cast<size_t>(it->second)].unit)].id;
  }
  throw InvalidArgument("zero3::libtorch::ShardedModel::unit_of: the model has no wrapped parameter '" + name + "'");
}

torch::OrderedDict<std::string, at::Tensor> ShardedModel::gather_state_dict() {
  ModelCore& c = *core_;
  if (!c.materialized) {
    throw InvalidArgument("zero3::libtorch::ShardedModel::gather_state_dict: call materialize() first");
  }
  std::map<int, at::Tensor> by_param;
  for (const detail::UnitDesc& u : c.units) {
    if (!u.id.valid()) continue;
    at::Tensor flat = at::empty({c.engine.unit(u.id).numel}, at::TensorOptions().dtype(at::kFloat));
    c.engine.gather_master_params(u.id, flat.data_ptr<float>());
    for (int i : u.params) {
      const ParamInfo& info = c.engine.param(c.params[static_cast<size_t>(i)].id);
      by_param[i] = flat.slice(0, info.offset, info.offset + info.numel).view(info.shape).clone();
    }
  }
  torch::OrderedDict<std::string, at::Tensor> out;
  for (size_t i = 0; i < c.params.size(); ++i) out.insert(c.params[i].name, by_param[static_cast<int>(i)]);
  return out;
}

ExportOptions ShardedModel::export_options() const {
  ExportOptions o;
  o.naming = TensorNaming::local;  // local names are the module's own parameter names, unique by construction
  return o;
}

ParamResidency ShardedModel::residency() const {
  ParamResidency r;
  for (const auto& item : core_->model->named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    ++r.parameters;
    r.storage_bytes += t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
    if (t.numel() > 0) {
      ++r.full;
      r.full_bytes += static_cast<int64_t>(t.numel() * t.element_size());
    }
  }
  return r;
}

}  // namespace zero3::libtorch

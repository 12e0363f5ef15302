// Units built one at a time (UnitFactory): each module is constructed, installed in the model and its parameters'
// storage freed before the next is constructed; materialize() runs each factory again, with the CPU generator in
// the state of its first run, for this rank's slices.
#include <torch/nn/modules/container/modulelist.h>

#include <cstring>
#include <map>

#include "model_core.hpp"

namespace zero3::libtorch::detail {
namespace {

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().sizes().vec());
  return out;
}

std::shared_ptr<torch::nn::Module> make_module(const UnitFactory& f) {
  std::shared_ptr<torch::nn::Module> m = f.make();
  if (!m) throw InvalidArgument("zero3::libtorch: the UnitFactory of '" + f.path + "' made no module (null)");
  return m;
}

void install(torch::nn::Module& model, const UnitFactory& f, const std::shared_ptr<torch::nn::Module>& module) {
  if (f.install) {
    f.install(module);
  } else {
    const size_t dot = f.path.rfind('.');
    const std::string parent_path = dot == std::string::npos ? "" : f.path.substr(0, dot);
    const std::string name = dot == std::string::npos ? f.path : f.path.substr(dot + 1);
    std::shared_ptr<torch::nn::Module> parent;
    if (parent_path.empty()) {
      parent = model.shared_from_this();
    } else {
      for (const auto& item : model.named_modules("", /*include_self=*/false)) {
        if (item.key() == parent_path) parent = item.value();
      }
    }
    if (!parent) {
      throw InvalidArgument("zero3::libtorch: UnitFactory '" + f.path + "': the model has no submodule '" +
                            parent_path + "' to install it in (build the parents first, or give UnitFactory::install)");
    }
    if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(parent.get())) {
      if (name != std::to_string(list->size())) {
        throw InvalidArgument("zero3::libtorch: UnitFactory '" + f.path + "': ModuleList '" + parent_path + "' has " +
                              std::to_string(list->size()) + " modules, so the next one it takes is '" + parent_path +
                              "." + std::to_string(list->size()) + "'");
      }
      list->push_back(module);
    } else {
      parent->register_module(name, module);
    }
  }
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (item.key() == f.path) {
      if (item.value().get() != module.get()) break;
      return;
    }
  }
  throw InvalidArgument("zero3::libtorch: UnitFactory '" + f.path +
                        "': after installing, the model's submodule at that path is not the module the factory made");
}

}  // namespace

void UnitRebuilder::build_all(torch::nn::Module& model) {
  std::map<std::string, int> paths;
  for (size_t k = 0; k < factories.size(); ++k) {
    const UnitFactory& f = factories[k];
    if (f.path.empty() || !f.make)
      throw InvalidArgument("zero3::libtorch: a UnitFactory needs a path and a make function");
    if (!paths.emplace(f.path, static_cast<int>(k)).second) {
      throw InvalidArgument("zero3::libtorch: two UnitFactory entries for '" + f.path + "'");
    }
    rng_states.push_back(cpu_rng_state());
    std::shared_ptr<torch::nn::Module> module = make_module(f);
    install(model, f, module);
    declared.push_back(parameter_shapes(*module));
    // The module stays in the model with its parameters' sizes (for the declaration) and no storage: materialize()
    // empties them as any other.
    for (const at::Tensor& t : module->parameters(/*recurse=*/true)) {
      c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      impl->set_storage_keep_dtype(
          c10::Storage(c10::Storage::use_byte_size_t(), size_t{0}, c10::DataPtr(nullptr, t.device()), nullptr, false));
    }
  }
  rng_after = cpu_rng_state();
}

void UnitRebuilder::read(int factory, const std::string& local, int64_t begin, int64_t end, float* out) {
  if (built_ != factory) {
    module_.reset();  // the previous unit first: one at full size at a time
    flat_.clear();
    built_ = -1;
    const UnitFactory& f = factories.at(static_cast<size_t>(factory));
    set_cpu_rng_state(rng_states[static_cast<size_t>(factory)]);
    module_ = make_module(f);
    if (parameter_shapes(*module_) != declared[static_cast<size_t>(factory)]) {
      throw InvalidArgument("zero3::libtorch: UnitFactory '" + f.path +
                            "' built a module with other parameters (names or shapes) the second time: make() must "
                            "build the same module each time");
    }
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      flat_[item.key()] = item.value().detach().contiguous().view({-1});
    }
    built_ = factory;
  }
  const at::Tensor part = flat_.at(local).slice(0, begin, end).to(at::kCPU, at::kFloat).contiguous();
  std::memcpy(out, part.data_ptr<float>(), static_cast<size_t>(end - begin) * sizeof(float));
}

void UnitRebuilder::finish() {
  module_.reset();
  flat_.clear();
  built_ = -1;
  if (rng_after.defined()) set_cpu_rng_state(rng_after);
}

int UnitRebuilder::factory_of(const std::string& name) const {
  for (size_t k = 0; k < factories.size(); ++k) {
    const std::string& path = factories[k].path;
    if (name.size() > path.size() && name.compare(0, path.size(), path) == 0 && name[path.size()] == '.') {
      return static_cast<int>(k);
    }
  }
  return -1;
}

}  // namespace zero3::libtorch::detail

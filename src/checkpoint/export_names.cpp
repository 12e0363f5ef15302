#include "checkpoint/export_names.hpp"

#include <map>
#include <set>

#include "zero3/error.hpp"

namespace zero3::ckpt {

std::vector<std::string> export_names(const std::vector<NamedParam>& params, const ExportOptions& options) {
  std::set<std::string> full_names;
  std::map<std::string, int> local_count;
  for (const NamedParam& p : params) {
    full_names.insert(p.full_name);
    ++local_count[p.local_name];
  }
  for (const auto& [from, to] : options.name_map) {
    if (!full_names.count(from)) {
      throw CheckpointError("name map: '" + from + "' is not a parameter of the model (keys are full names, " +
                            "\"<unit>.<param>\", e.g. '" + (params.empty() ? std::string("?") : params[0].full_name) +
                            "')");
    }
    if (to.empty()) throw CheckpointError("name map: '" + from + "' is mapped to an empty name");
  }
  TensorNaming rule = options.naming;
  std::string shared;
  for (const auto& [name, n] : local_count) {
    if (n > 1) {
      shared = name;
      break;
    }
  }
  if (rule == TensorNaming::automatic) rule = shared.empty() ? TensorNaming::local : TensorNaming::full;
  if (rule == TensorNaming::local && !shared.empty()) {
    throw CheckpointError("tensor naming 'local': " + std::to_string(local_count[shared]) +
                          " units have a parameter named '" + shared + "'; use full names or a name map");
  }
  std::vector<std::string> out;
  std::map<std::string, std::string> taken;  // output name -> full name
  for (const NamedParam& p : params) {
    auto mapped = options.name_map.find(p.full_name);
    std::string name = mapped != options.name_map.end() ? mapped->second
                       : rule == TensorNaming::local    ? p.local_name
                                                        : p.full_name;
    auto [it, fresh] = taken.emplace(name, p.full_name);
    if (!fresh) {
      throw CheckpointError("parameters '" + it->second + "' and '" + p.full_name + "' would both be named '" + name +
                            "' in the exported files");
    }
    out.push_back(std::move(name));
  }
  return out;
}

const char* tensor_naming_name(TensorNaming naming) {
  switch (naming) {
    case TensorNaming::automatic:
      return "automatic";
    case TensorNaming::full:
      return "full";
    case TensorNaming::local:
      return "local";
  }
  return "?";
}

std::optional<TensorNaming> parse_tensor_naming(const std::string& text) {
  if (text == "auto" || text == "automatic") return TensorNaming::automatic;
  if (text == "full") return TensorNaming::full;
  if (text == "local") return TensorNaming::local;
  return std::nullopt;
}

}  // namespace zero3::ckpt

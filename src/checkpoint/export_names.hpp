// The names parameters get in exported safetensors files (ExportOptions::naming and name_map).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zero3/checkpoint.hpp"

namespace zero3::ckpt {

struct NamedParam {
  std::string full_name;   // "<unit>.<param>"
  std::string local_name;  // "<param>"
};

// One output name per parameter, in order. Throws CheckpointError for a name_map key that is not a parameter,
// for TensorNaming::local with a local name two units share, and for two parameters given the same name.
std::vector<std::string> export_names(const std::vector<NamedParam>& params, const ExportOptions& options);

// "automatic", "full", "local"; and back (nullopt for anything else).
const char* tensor_naming_name(TensorNaming naming);
std::optional<TensorNaming> parse_tensor_naming(const std::string& text);

}  // namespace zero3::ckpt

// Hugging Face safetensors <-> the model's flat unit buffers, by parameter name, in one process.
//
// For the single-process reference, the tests and tools. (Under ZeRO-3 the engine's pretrained init reads
// only each rank's slice through zero3::safetensors::make_f32_reader instead.)
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "llama_layout.hpp"
#include "llama_model.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

namespace llama3 {

// The error for a parameter `p` of unit `unit` that the file `source` lacks: names the file, the tensor, the
// unit and the shape; for lm_head.weight, that checkpoints of models with tied embeddings store none.
zero3::IoError missing_tensor_error(const std::string& source, const ParamSpec& p, const std::string& unit);

// Fills buffers[u] (units[u].numel elements each) from the tensors of `reader` named like units[u]'s params.
// Any stored float type (f32, bf16, f16, f64) is accepted. Throws zero3::IoError naming the parameter when one
// is missing or has another shape. Returns the names of tensors in the file that are not model parameters
// (e.g. rotary_emb.inv_freq buffers of old checkpoints), so the caller can decide what to do with them.
template <typename T>
std::vector<std::string> load_units(const zero3::safetensors::ShardedSafetensorsReader& reader,
                                    const std::vector<UnitLayout>& units, const std::vector<T*>& buffers);

// The parameters of `model` from a safetensors file, a directory or an index (see ShardedSafetensorsReader).
template <typename T>
std::vector<std::string> load_hf_weights(FlatModel<T>& model, const std::filesystem::path& path);

}  // namespace llama3

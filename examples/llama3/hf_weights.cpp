#include "hf_weights.hpp"

#include <set>
#include <type_traits>

#include "zero3/error.hpp"

namespace llama3 {

zero3::IoError missing_tensor_error(const std::string& source, const ParamSpec& p, const std::string& unit) {
  std::string hint;
  if (p.name == "lm_head.weight") {
    hint =
        "; checkpoints of models with tied embeddings store none: is tie_word_embeddings true in the model's "
        "config.json?";
  }
  return zero3::IoError(source + ": no tensor '" + p.name + "' (parameter of unit " + unit + ", shape " +
                        zero3::safetensors::shape_string(p.shape) + ")" + hint);
}

template <typename T>
std::vector<std::string> load_units(const zero3::safetensors::ShardedSafetensorsReader& reader,
                                    const std::vector<UnitLayout>& units, const std::vector<T*>& buffers) {
  if (units.size() != buffers.size()) {
    throw zero3::InvalidArgument("load_units: " + std::to_string(units.size()) + " units but " +
                                 std::to_string(buffers.size()) + " buffers");
  }
  std::set<std::string> used;
  std::vector<float> staging;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const ParamSpec& p : units[u].params) {
      const zero3::safetensors::TensorInfo* info = reader.find(p.name);
      if (info == nullptr) throw missing_tensor_error(reader.source().string(), p, units[u].name);
      if (info->shape != p.shape) {
        throw zero3::IoError(reader.source().string() + ": tensor '" + p.name + "' has shape " +
                             zero3::safetensors::shape_string(info->shape) + ", the model expects " +
                             zero3::safetensors::shape_string(p.shape));
      }
      T* dst = buffers[u] + p.offset;
      if constexpr (std::is_same_v<T, float>) {
        reader.read_as_f32(p.name, 0, p.numel, dst);
      } else {
        staging.resize(static_cast<size_t>(p.numel));
        reader.read_as_f32(p.name, 0, p.numel, staging.data());
        for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<T>(staging[i]);
      }
      used.insert(p.name);
    }
  }
  std::vector<std::string> unused;
  for (const std::string& name : reader.names())
    if (!used.count(name)) unused.push_back(name);
  return unused;
}

template <typename T>
std::vector<std::string> load_hf_weights(FlatModel<T>& model, const std::filesystem::path& path) {
  zero3::safetensors::ShardedSafetensorsReader reader(path);
  std::vector<T*> buffers;
  for (size_t u = 0; u < model.units().size(); ++u) buffers.push_back(model.unit_params(u).data());
  return load_units(reader, model.units(), buffers);
}

template std::vector<std::string> load_units<float>(const zero3::safetensors::ShardedSafetensorsReader&,
                                                    const std::vector<UnitLayout>&, const std::vector<float*>&);
template std::vector<std::string> load_units<double>(const zero3::safetensors::ShardedSafetensorsReader&,
                                                     const std::vector<UnitLayout>&, const std::vector<double*>&);
template std::vector<std::string> load_hf_weights<float>(FlatModel<float>&, const std::filesystem::path&);
template std::vector<std::string> load_hf_weights<double>(FlatModel<double>&, const std::filesystem::path&);

}  // namespace llama3

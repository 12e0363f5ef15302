// Models split into shards: reading model.safetensors.index.json, opening every shard it names, and the
// f32 element-range readers that the engine's pretrained init rule takes.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "io/file_util.hpp"
#include "io/safetensors_detail.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::safetensors {

using detail::printable;
namespace fs = std::filesystem;

namespace {

constexpr int kMaxIndexDepth = 64;

struct DuplicateKey {
  std::string message;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The index as JSON, with duplicate keys refused (nlohmann would keep the last one silently).
nlohmann::json read_index_json(const fs::path& index) {
  io::FileDescriptor fd = io::open_read(index);
  const uint64_t size = io::file_size(fd.get(), index);
  if (size > kMaxHeaderBytes) {
    throw IoError(index.string() + ": " + std::to_string(size) + " bytes is too large for a safetensors index");
  }
  std::string text(size, '\0');
  io::pread_exact(fd.get(), text.data(), size, 0, index);
  std::vector<std::unordered_set<std::string>> keys;
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (depth > kMaxIndexDepth) {
      throw DuplicateKey{"nests deeper than " + std::to_string(kMaxIndexDepth) + " levels"};
    }
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) throw DuplicateKey{"has the key " + printable(k) + " twice in one object"};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, check);
  } catch (const DuplicateKey& e) {
    throw IoError(index.string() + ": the index " + e.message);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(index.string() + ": the index is not valid JSON: " + printable(e.what(), true));
  }
}

// A shard's path from the weight map must stay inside the index's directory.
void check_shard_name(const std::string& file, const std::string& tensor, const fs::path& index) {
  fs::path p(file);
  bool bad = file.empty() || p.is_absolute();
  for (const fs::path& part : p) bad = bad || part == "..";
  if (bad) {
    throw IoError(index.string() + ": weight_map puts tensor " + printable(tensor) + " in " + printable(file) +
                  ", which is not a file name inside the index's directory");
  }
}

// What `path` names: an index file or a single safetensors file.
fs::path resolve_source(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw IoError(path.string() + ": no such file or directory");
  if (!fs::is_directory(path, ec)) return path;
  if (fs::exists(path / "model.safetensors.index.json", ec)) return path / "model.safetensors.index.json";
  if (fs::exists(path / "model.safetensors", ec)) return path / "model.safetensors";
  std::vector<fs::path> indexes, files;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (ends_with(name, ".safetensors.index.json")) indexes.push_back(e.path());
    if (ends_with(name, ".safetensors")) files.push_back(e.path());
  }
  if (ec) throw IoError("cannot list directory " + path.string() + ": " + ec.message());
  if (indexes.size() == 1) return indexes[0];
  if (indexes.empty() && files.size() == 1) return files[0];
  throw IoError(path.string() + ": found no model.safetensors.index.json or model.safetensors, and " +
                std::to_string(indexes.size()) + " *.safetensors.index.json and " + std::to_string(files.size()) +
                " *.safetensors files; name the file to load");
}

}  // namespace

ShardedSafetensorsReader::ShardedSafetensorsReader(const fs::path& path) : source_(resolve_source(path)) {
  if (!ends_with(source_.filename().string(), ".json")) {
    shards_.emplace_back(source_);
    for (const TensorInfo& t : shards_[0].tensors()) shard_of_.emplace(t.name, 0);
    return;
  }
  const nlohmann::json index = read_index_json(source_);
  const std::string label = source_.string();
  if (!index.is_object()) throw IoError(label + ": the index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end()) throw IoError(label + ": the index has no \"weight_map\"");
  if (!wm->is_object()) throw IoError(label + ": \"weight_map\" is not an object of tensor name -> file name");

  // Open each shard once, in file-name order, and remember one tensor of each for the error message.
  std::map<std::string, std::vector<std::string>> tensors_of;  // shard file -> tensors the map puts there
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string()) {
      throw IoError(label + ": weight_map[" + printable(tensor) + "] is not a string naming a shard file");
    }
    const std::string& name = file.get_ref<const std::string&>();
    check_shard_name(name, tensor, source_);
    tensors_of[name].push_back(tensor);
  }
  const fs::path dir = source_.parent_path();
  shards_.reserve(tensors_of.size());
  for (const auto& [file, tensors] : tensors_of) {
    try {
      shards_.emplace_back(dir / file);
    } catch (const IoError& e) {
      throw IoError(label + ": shard " + printable(file) + " (holding " + std::to_string(tensors.size()) +
                    " tensors of the weight map, e.g. " + printable(tensors.front()) + ") cannot be read: " + e.what());
    }
    const size_t s = shards_.size() - 1;
    for (const std::string& tensor : tensors) {
      if (!shards_[s].find(tensor)) {
        throw IoError(label + ": weight_map puts tensor " + printable(tensor) + " in " + printable(file) +
                      ", but that shard has no such tensor");
      }
      shard_of_.emplace(tensor, s);
    }
  }
  // Tensors present in a shard but absent from the map are not part of the model (transformers agrees).
  uint64_t total = 0;
  for (const auto& [tensor, s] : shard_of_) total += shards_[s].find(tensor)->nbytes();
  auto meta = index.find("metadata");
  if (meta != index.end() && meta->is_object()) {
    auto ts = meta->find("total_size");
    if (ts != meta->end() && ts->is_number_unsigned() && ts->get<uint64_t>() != total) {
      log::debug(label, ": metadata.total_size says ", ts->get<uint64_t>(), " bytes; the mapped tensors hold ", total);
    }
  }
}

std::vector<std::string> ShardedSafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, s] : shard_of_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const SafetensorsReader* ShardedSafetensorsReader::locate(std::string_view name) const {
  auto it = shard_of_.find(std::string(name));
  return it == shard_of_.end() ? nullptr : &shards_[it->second];
}

const TensorInfo* ShardedSafetensorsReader::find(std::string_view name) const {
  const SafetensorsReader* r = locate(name);
  return r ? r->find(name) : nullptr;
}

const SafetensorsReader& ShardedSafetensorsReader::shard_of(std::string_view name) const {
  const SafetensorsReader* r = locate(name);
  if (!r) throw IoError(source_.string() + ": no tensor " + printable(name));
  return *r;
}

const TensorInfo& ShardedSafetensorsReader::tensor(std::string_view name) const { return shard_of(name).tensor(name); }

void ShardedSafetensorsReader::read_range(std::string_view name, int64_t element_begin, int64_t element_end,
                                          void* out) const {
  shard_of(name).read_range(name, element_begin, element_end, out);
}

void ShardedSafetensorsReader::read_as_f32(std::string_view name, int64_t element_begin, int64_t element_end,
                                           float* out) const {
  shard_of(name).read_as_f32(name, element_begin, element_end, out);
}

F32RangeReader make_f32_reader(std::shared_ptr<const ShardedSafetensorsReader> model, std::string tensor_name,
                               int64_t expected_numel) {
  if (!model) throw InvalidArgument("make_f32_reader: no model given for tensor " + printable(tensor_name));
  const SafetensorsReader& shard = model->shard_of(tensor_name);
  const TensorInfo& t = shard.tensor(tensor_name);
  if (t.dtype != Dtype::f32 && t.dtype != Dtype::bf16 && t.dtype != Dtype::f16 && t.dtype != Dtype::f64) {
    throw Unsupported("tensor " + printable(tensor_name) + " of " + shard.path().string() + " is " +
                      std::string(dtype_name(t.dtype)) + "; a parameter can be loaded from F32, BF16, F16 or F64");
  }
  if (expected_numel >= 0 && t.numel() != expected_numel) {
    throw InvalidArgument("tensor " + printable(tensor_name) + " of " + shard.path().string() + " has " +
                          std::to_string(t.numel()) + " elements (shape " + shape_string(t.shape) +
                          ") but the parameter it is mapped to has " + std::to_string(expected_numel));
  }
  // The shard reference stays valid while `model` lives, and the closure owns `model`. A parameter that starts
  // at NaN or Inf makes every step's gradients non-finite: each step would be skipped and the run would train
  // nothing, so such values are refused here, naming the tensor and the element.
  return [model = std::move(model), reader = &shard, name = std::move(tensor_name)](int64_t begin, int64_t end,
                                                                                    float* out) {
    reader->read_as_f32(name, begin, end, out);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < end - begin; ++i) {
      if (!std::isfinite(out[i])) {
        if (bad++ == 0) first = i;
      }
    }
    if (bad > 0) {
      const TensorInfo& t = reader->tensor(name);
      throw InvalidArgument("tensor " + printable(name) + " of " + reader->path().string() + " " +
                            shape_string(t.shape) + " holds " + std::to_string(bad) +
                            " non-finite value(s) in elements [" + std::to_string(begin) + ", " + std::to_string(end) +
                            "), the first at element " + std::to_string(begin + first) + " (" +
                            (std::isnan(out[first]) ? "NaN"
                             : out[first] > 0       ? "+Inf"
                                                    : "-Inf") +
                            "); a parameter cannot start from NaN or Inf (every step would be skipped)");
    }
  };
}

}  // namespace zero3::safetensors

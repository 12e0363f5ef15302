#include "checkpoint/shard_check.hpp"

#include <map>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/manifest.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace {

// The file's header against the manifest's entry for it: the save that wrote it (tag, rank, world size) and,
// in files of this version on, the ranges it holds and the save's counters. "" when they agree.
std::string check_metadata(const CheckpointInfo& info, const CheckpointFile& f,
                           const std::map<std::string, std::string>& metadata) {
  auto value = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  const std::string* format = value("format");
  if (format == nullptr || *format != "zero3-checkpoint-shard") {
    return "is not a zero3 checkpoint shard (its header's __metadata__.format is " +
           (format ? "'" + *format + "'" : std::string("missing")) + ", expected 'zero3-checkpoint-shard')";
  }
  std::vector<std::pair<const char*, std::string>> expected = {
      {"tag", info.tag}, {"rank", std::to_string(f.rank)}, {"world_size", std::to_string(info.world_size)}};
  if (info.pipeline_stages > 1) expected.emplace_back("pipeline_stage", std::to_string(f.pipeline_stage));
  for (const auto& [key, want] : expected) {
    const std::string* got = value(key);
    if (got == nullptr || *got != want) {
      return "was written with " + std::string(key) + " " + (got ? "'" + *got + "'" : "(none)") +
             " (its header's __metadata__), but the manifest says '" + want +
             "' (a shard file from another save, rank or pipeline stage, or a manifest edited after the save)";
    }
  }
  if (const std::string* got = value("ranges")) {
    std::vector<std::string> names;
    for (const CheckpointUnit& u : info.units) names.push_back(u.name);
    const std::string want = ranges_metadata(names, f.ranges);
    if (*got != want) {
      auto cut = [](const std::string& t) { return t.size() > 240 ? t.substr(0, 240) + "..." : t; };
      return "holds other elements than the manifest says: its header's __metadata__.ranges is " + cut(*got) +
             ", the manifest's ranges " + cut(want) + " (were the manifest's ranges edited or swapped between files?)";
    }
  }
  if (const std::string* got = value("training_state")) {
    const nlohmann::json saved = nlohmann::json::parse(*got, nullptr, false);
    const nlohmann::ordered_json claimed = nlohmann::ordered_json::parse(training_state_metadata(info.training_state));
    if (!saved.is_object()) return "has a __metadata__.training_state that is not a JSON object: " + *got;
    for (const auto& [key, want] : claimed.items()) {
      const auto it = saved.find(key);
      if (it == saved.end() || *it != want) {
        return "was saved at training_state." + key + " " + (it == saved.end() ? "(none)" : it->dump()) +
               " (its header's __metadata__), but the manifest says " + want.dump() +
               " (the manifest's counters were changed after the save; to count from other values, load the "
               "checkpoint and then call Engine::restore_training_state)";
      }
    }
  }
  return "";
}

}  // namespace

std::string check_shard_file(const CheckpointInfo& info, size_t file,
                             std::optional<safetensors::SafetensorsReader>* reader) {
  const CheckpointFile& f = info.files.at(file);
  const std::filesystem::path path = info.path / f.name;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) return "missing (the manifest lists it)";
  if (!std::filesystem::is_regular_file(status)) return "not a regular file";
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return "cannot stat: " + ec.message();
  if (size != f.bytes) {
    return "is " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f.bytes) +
           (size < f.bytes ? " (truncated)" : "");
  }
  FileChecksum sum;
  try {
    sum = checksum_file(path);
  } catch (const IoError& e) {
    return std::string("cannot read: ") + e.what();
  }
  if (sum.size != f.bytes) return "changed size while being read";
  if (sum.crc32c != f.crc32c) {
    return "CRC-32C mismatch: the file's is " + crc_hex(sum.crc32c) + ", the manifest records " + crc_hex(f.crc32c) +
           " (the file is corrupt)";
  }
  try {
    safetensors::SafetensorsReader r(path);
    if (std::string problem = check_metadata(info, f, r.metadata()); !problem.empty()) return problem;
    for (const CheckpointRange& range : f.ranges) {
      const std::string& unit = info.units.at(static_cast<size_t>(range.unit)).name;
      for (StatePart part : kStateParts) {
        const std::string name = shard_tensor_name(unit, part);
        const safetensors::TensorInfo* t = r.find(name);
        if (t == nullptr) return "has no tensor '" + name + "'";
        if (t->dtype != safetensors::Dtype::f32 || t->shape != std::vector<int64_t>{range.length}) {
          return "tensor '" + name + "' is " + std::string(safetensors::dtype_name(t->dtype)) + " " +
                 safetensors::shape_string(t->shape) + ", expected F32 [" + std::to_string(range.length) + "]";
        }
      }
    }
    if (reader) reader->emplace(std::move(r));
  } catch (const Error& e) {
    return std::string("not a valid shard file: ") + e.what();
  }
  return "";
}

}  // namespace zero3::ckpt

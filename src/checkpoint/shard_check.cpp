#include "checkpoint/shard_check.hpp"

#include <system_error>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/manifest.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {

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

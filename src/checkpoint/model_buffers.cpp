#include "checkpoint/model_buffers.hpp"

#include <map>
#include <set>

#include "checkpoint/crc32c.hpp"
#include "io/file_util.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace fs = std::filesystem;
namespace st = safetensors;

std::vector<CheckpointBuffer> describe_buffers(const std::vector<ModelBuffer>& buffers) {
  std::vector<CheckpointBuffer> out;
  for (const ModelBuffer& b : buffers) out.push_back({b.name, b.dtype, b.shape});
  return out;
}

std::vector<st::TensorDecl> buffer_decls(const std::vector<CheckpointBuffer>& buffers) {
  std::vector<st::TensorDecl> out;
  for (const CheckpointBuffer& b : buffers) out.push_back({b.name, b.dtype, b.shape});
  return out;
}

uint64_t buffer_bytes(const ModelBuffer& buffer) { return st::tensor_bytes({buffer.name, buffer.dtype, buffer.shape}); }

CheckpointFile write_buffers_file(const std::vector<ModelBuffer>& buffers, const fs::path& path) {
  std::vector<st::TensorDecl> decls = buffer_decls(describe_buffers(buffers));
  st::SafetensorsWriter writer(path, decls, {{"format", "zero3-checkpoint-buffers"}});
  for (const ModelBuffer& b : buffers) writer.write(b.name, b.data, static_cast<size_t>(buffer_bytes(b)));
  writer.finish();
  // The file is small (running statistics): its CRC-32C is taken over what is on disk.
  CheckpointFile f;
  f.name = path.filename().string();
  io::FileDescriptor fd = io::open_read(path);
  f.bytes = io::file_size(fd.get(), path);
  std::vector<unsigned char> bytes(static_cast<size_t>(f.bytes));
  io::pread_exact(fd.get(), bytes.data(), bytes.size(), 0, path);
  f.crc32c = crc32c_update(0, bytes.data(), bytes.size());
  return f;
}

std::string check_buffers_file(const CheckpointInfo& info) {
  if (info.buffers_file.name.empty()) return "";
  const fs::path path = info.path / info.buffers_file.name;
  try {
    std::error_code ec;
    if (!fs::exists(path, ec)) return "missing";
    io::FileDescriptor fd = io::open_read(path);
    const uint64_t size = io::file_size(fd.get(), path);
    if (size != info.buffers_file.bytes) {
      return "size " + std::to_string(size) + " bytes, the manifest records " + std::to_string(info.buffers_file.bytes);
    }
    std::vector<unsigned char> bytes(static_cast<size_t>(size));
    io::pread_exact(fd.get(), bytes.data(), bytes.size(), 0, path);
    const uint32_t crc = crc32c_update(0, bytes.data(), bytes.size());
    if (crc != info.buffers_file.crc32c) return "CRC-32C mismatch (the file changed after the save)";
    const st::SafetensorsReader reader(path);
    for (const CheckpointBuffer& b : info.buffers) {
      const st::TensorInfo* t = reader.find(b.name);
      if (t == nullptr || t->dtype != b.dtype || t->shape != b.shape) {
        return "does not hold buffer '" + b.name + "' as the manifest declares it";
      }
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string buffers_difference(const CheckpointInfo& info, const std::vector<ModelBuffer>& buffers) {
  std::map<std::string, const CheckpointBuffer*> saved;
  for (const CheckpointBuffer& b : info.buffers) saved[b.name] = &b;
  for (const ModelBuffer& b : buffers) {
    auto it = saved.find(b.name);
    if (it == saved.end()) {
      return "the model has buffer '" + b.name + "', the checkpoint " +
             (info.buffers.empty() ? std::string("holds no buffers (saved by a program that registered none)")
                                   : "does not");
    }
    const CheckpointBuffer& s = *it->second;
    if (s.dtype != b.dtype || s.shape != b.shape) {
      return "buffer '" + b.name + "' is " + std::string(st::dtype_name(b.dtype)) + " " + st::shape_string(b.shape) +
             " in the model, " + std::string(st::dtype_name(s.dtype)) + " " + st::shape_string(s.shape) +
             " in the checkpoint";
    }
    saved.erase(it);
  }
  if (!saved.empty()) {
    return "the checkpoint holds buffer '" + saved.begin()->first + "', which the model does not have" +
           (buffers.empty() ? " (the program registered no buffers: Engine::set_buffer_source)" : "");
  }
  return "";
}

void read_buffers(const CheckpointInfo& info, const std::vector<ModelBuffer>& buffers) {
  if (buffers.empty()) return;
  const st::SafetensorsReader reader(info.path / info.buffers_file.name);
  for (const ModelBuffer& b : buffers) {
    const st::TensorInfo& t = reader.tensor(b.name);
    reader.read_range(b.name, 0, t.numel(), b.data);
  }
}

void export_buffers(const CheckpointInfo& info, st::ShardedSafetensorsWriter& writer) {
  if (info.buffers.empty()) return;
  const st::SafetensorsReader reader(info.path / info.buffers_file.name);
  std::vector<unsigned char> bytes;
  for (const CheckpointBuffer& b : info.buffers) {
    const st::TensorInfo& t = reader.tensor(b.name);
    bytes.resize(static_cast<size_t>(t.nbytes()));
    reader.read_range(b.name, 0, t.numel(), bytes.data());
    writer.write(b.name, bytes.data(), bytes.size());
  }
}

void check_export_names(const std::vector<st::TensorDecl>& params, const std::vector<CheckpointBuffer>& buffers) {
  std::set<std::string> names;
  for (const st::TensorDecl& d : params) names.insert(d.name);
  for (const CheckpointBuffer& b : buffers) {
    if (names.count(b.name)) {
      throw CheckpointError("buffer '" + b.name + "' has the exported name of a parameter: rename one of them");
    }
  }
}

}  // namespace zero3::ckpt

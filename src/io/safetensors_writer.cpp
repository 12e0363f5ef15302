// Writing one safetensors file as a stream: the header is fixed by the declarations, the data follows in
// declaration order, and the file is published by an atomic rename only once it is complete.
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/atomic_file.hpp"
#include "io/safetensors_detail.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::safetensors {

using detail::printable;

uint64_t tensor_bytes(const TensorDecl& decl) {
  for (int64_t d : decl.shape) {
    if (d < 0) {
      throw InvalidArgument("tensor " + printable(decl.name) + ": shape " + shape_string(decl.shape) +
                            " has a negative dimension");
    }
  }
  std::optional<int64_t> numel = detail::checked_numel(decl.shape);
  std::optional<uint64_t> bits = numel ? detail::checked_bits(*numel, dtype_bits(decl.dtype)) : std::nullopt;
  if (!bits) {
    throw InvalidArgument("tensor " + printable(decl.name) + ": shape " + shape_string(decl.shape) + " of " +
                          std::string(dtype_name(decl.dtype)) + " overflows 64 bits");
  }
  if (*bits % 8 != 0) {
    throw InvalidArgument("tensor " + printable(decl.name) + ": shape " + shape_string(decl.shape) + " of " +
                          std::string(dtype_name(decl.dtype)) + " does not fill whole bytes");
  }
  return *bits / 8;
}

std::map<std::string, std::string> default_metadata() { return {{"format", "pt"}}; }

struct SafetensorsWriter::Impl {
  explicit Impl(const std::filesystem::path& path) : file(path) {}

  io::AtomicFile file;
  std::vector<TensorDecl> decls;
  std::vector<uint64_t> sizes;
  std::unordered_map<std::string, size_t> index;
  size_t current = 0;    // tensor being written
  uint64_t written = 0;  // bytes of decls[current] given so far
  std::vector<char> buffer;
  size_t fill = 0;
  bool finished = false;
  bool failed = false;  // an earlier call threw; the file can no longer be completed

  static constexpr size_t kBufferBytes = size_t{1} << 20;

  void append(const void* data, size_t bytes) {
    if (bytes == 0) return;  // `data` may be null then
    if (bytes >= kBufferBytes) {
      flush();
      file.write(data, bytes);
      return;
    }
    if (buffer.empty()) buffer.resize(kBufferBytes);
    if (fill + bytes > buffer.size()) flush();
    std::memcpy(buffer.data() + fill, data, bytes);
    fill += bytes;
  }

  void flush() {
    if (fill == 0) return;
    file.write(buffer.data(), fill);
    fill = 0;
  }
};

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<TensorDecl> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)) {
  const std::string label = "safetensors file " + path_.string();
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) {
      if (!detail::valid_utf8(k) || !detail::valid_utf8(v)) {
        throw InvalidArgument(label + ": __metadata__ entry " + printable(k, true) + " is not valid UTF-8");
      }
      meta[k] = v;
    }
    header["__metadata__"] = std::move(meta);
  }
  std::unordered_map<std::string, size_t> index;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDecl& d = tensors[i];
    if (d.name.empty()) throw InvalidArgument(label + ": tensor " + std::to_string(i) + " has an empty name");
    if (d.name == "__metadata__") throw InvalidArgument(label + ": '__metadata__' is reserved, not a tensor name");
    if (!detail::valid_utf8(d.name)) {
      throw InvalidArgument(label + ": tensor name " + printable(d.name, true) + " is not valid UTF-8");
    }
    if (!index.emplace(d.name, i).second) {
      throw InvalidArgument(label + ": tensor " + printable(d.name) + " is declared twice");
    }
    const uint64_t bytes = tensor_bytes(d);
    if (offset + bytes < offset) throw InvalidArgument(label + ": the tensors' total size overflows 64 bits");
    header[d.name] = {{"dtype", dtype_name(d.dtype)}, {"shape", d.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string text = header.dump();
  // Pad with spaces so that the data buffer starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    throw InvalidArgument(label + ": the header would be " + std::to_string(text.size()) +
                          " bytes, more than the format's limit of " + std::to_string(kMaxHeaderBytes));
  }
  header_bytes_ = text.size();
  data_bytes_ = offset;

  impl_ = std::make_unique<Impl>(path_);
  impl_->decls = std::move(tensors);
  impl_->sizes = std::move(sizes);
  impl_->index = std::move(index);

  // Reserve the whole file now: a full disk is reported before any data is produced, and the file is laid
  // out in one piece. File systems without fallocate simply skip this.
  const uint64_t total = file_size();
  if (total > 0 && ::fallocate(impl_->file.fd(), 0, 0, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) {
      throw IoError(label + ": cannot reserve " + std::to_string(total) + " bytes for " +
                    impl_->file.temp_path().string() + ": " + std::strerror(err) + " (errno " + std::to_string(err) +
                    ")");
    }
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header_bytes_ >> (8 * i));
  impl_->append(len, 8);
  impl_->append(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(std::string_view name, const void* data, size_t bytes) {
  Impl& s = *impl_;
  const std::string label = "safetensors file " + path_.string();
  if (s.finished) throw InvalidArgument(label + ": write of tensor " + printable(name) + " after finish()");
  if (s.failed) throw InvalidArgument(label + ": write of tensor " + printable(name) + " after an earlier failure");
  auto it = s.index.find(std::string(name));
  if (it == s.index.end()) throw InvalidArgument(label + ": tensor " + printable(name) + " was not declared");
  const size_t target = it->second;
  if (target < s.current) {
    throw InvalidArgument(label + ": tensor " + printable(name) + " is written after tensor " +
                          printable(s.decls[s.current].name) + "; tensors are written in declaration order");
  }
  if (target > s.current) {
    // Every tensor before `target` must be complete (tensors of zero bytes need no write).
    for (size_t i = s.current; i < target; ++i) {
      const uint64_t given = i == s.current ? s.written : 0;
      if (given != s.sizes[i]) {
        throw InvalidArgument(label + ": tensor " + printable(name) + " is written while tensor " +
                              printable(s.decls[i].name) + " has " + std::to_string(given) + " of its " +
                              std::to_string(s.sizes[i]) + " bytes; tensors are written in declaration order");
      }
    }
    s.current = target;
    s.written = 0;
  }
  if (bytes > s.sizes[target] - s.written) {
    throw InvalidArgument(label + ": tensor " + printable(name) + " (shape " + shape_string(s.decls[target].shape) +
                          " of " + std::string(dtype_name(s.decls[target].dtype)) + ") is " +
                          std::to_string(s.sizes[target]) + " bytes, but " + std::to_string(s.written + bytes) +
                          " were given");
  }
  try {
    s.append(data, bytes);
  } catch (...) {
    s.failed = true;
    throw;
  }
  s.written += bytes;
}

void SafetensorsWriter::write_from_f32(std::string_view name, const float* data, int64_t count) {
  auto it = impl_->index.find(std::string(name));
  if (it == impl_->index.end()) {
    throw InvalidArgument("safetensors file " + path_.string() + ": tensor " + printable(name) + " was not declared");
  }
  if (count < 0) throw InvalidArgument("write_from_f32: negative count " + std::to_string(count));
  const Dtype dtype = impl_->decls[it->second].dtype;
  const auto n = static_cast<size_t>(count);
  constexpr size_t kChunk = size_t{1} << 16;
  switch (dtype) {
    case Dtype::f32:
      write(name, data, n * sizeof(float));
      return;
    case Dtype::bf16:
    case Dtype::f16: {
      std::vector<uint16_t> out(std::min(n, kChunk));
      for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = std::min(kChunk, n - i);
        for (size_t j = 0; j < m; ++j)
          out[j] = dtype == Dtype::bf16 ? f32_to_bf16(data[i + j]) : f32_to_f16(data[i + j]);
        write(name, out.data(), m * sizeof(uint16_t));
      }
      return;
    }
    case Dtype::f64: {
      std::vector<double> out(std::min(n, kChunk));
      for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = std::min(kChunk, n - i);
        for (size_t j = 0; j < m; ++j) out[j] = data[i + j];
        write(name, out.data(), m * sizeof(double));
      }
      return;
    }
    default:
      throw Unsupported("write_from_f32 does not support dtype " + std::string(dtype_name(dtype)) + " (tensor " +
                        printable(name) + " of " + path_.string() + "); it converts to F32, BF16, F16 and F64");
  }
}

void SafetensorsWriter::finish() {
  Impl& s = *impl_;
  const std::string label = "safetensors file " + path_.string();
  if (s.finished) throw InvalidArgument(label + ": finish() called twice");
  if (s.failed) throw InvalidArgument(label + ": finish() after an earlier failure; the file was not written");
  for (size_t i = s.current; i < s.decls.size(); ++i) {
    const uint64_t given = i == s.current ? s.written : 0;
    if (given != s.sizes[i]) {
      throw InvalidArgument(label + ": tensor " + printable(s.decls[i].name) + " has " + std::to_string(given) +
                            " of its " + std::to_string(s.sizes[i]) + " bytes; every declared tensor must be written");
    }
  }
  try {
    s.flush();
    s.file.commit();
  } catch (...) {
    s.failed = true;
    throw;
  }
  s.finished = true;
}

}  // namespace zero3::safetensors

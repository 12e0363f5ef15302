// Safetensors files: Hugging Face's format for tensors on disk, read by byte range and written as a stream.
//
// A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
// strings), then the data buffer, which the tensors cover exactly, with no holes or overlaps. A model too
// big for one file is split into shards named in model.safetensors.index.json ("weight_map": name -> file).
// docs/safetensors.md lists every rule the reader enforces.
//
// Reading. SafetensorsReader opens one file, reads and validates its header, and then reads any element range
// of any tensor with pread: it never maps the file and never reads past what the header, checked against the
// file size, allows. A file that breaks a rule is an IoError naming the file, the tensor and the rule.
// ShardedSafetensorsReader does the same over a directory, an index file or a single file.
// make_f32_reader turns (reader, tensor name) into the element-range callback the engine's pretrained init
// rule takes, so each rank reads only the bytes of its own slice.
//
// Writing. The tensors are declared up front (so the header is known before any data), then their bytes are
// written in declaration order, in as many chunks as the caller likes, so a writer of a model holds one piece
// at a time. The file appears under its final name only when finish() succeeds: it is written under a
// temporary name in the same directory, fsync'ed and renamed, so a crash leaves either the old file or the
// new one, never a torn one. ShardedSafetensorsWriter plans shards by size like Hugging Face's
// save_pretrained (model-00001-of-0000N.safetensors + model.safetensors.index.json).
//
// Threads: the const read functions of a reader may be called from several threads at once (each call is
// its own pread sequence). A writer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zero3/dtype.hpp"

namespace zero3::safetensors {

// Element types of the format. Sub-byte types (f4, f6_*) are validated and can be read by byte-aligned
// element ranges; read_as_f32 converts only f32, bf16, f16 and f64.
enum class Dtype : uint8_t {
  boolean,  // "BOOL"
  u8,
  i8,
  u16,
  i16,
  u32,
  i32,
  u64,
  i64,
  f16,
  bf16,
  f32,
  f64,
  c64,  // complex with f32 parts
  f8_e4m3,
  f8_e5m2,
  f8_e8m0,
  f8_e4m3fnuz,
  f8_e5m2fnuz,
  f4,
  f6_e2m3,
  f6_e3m2,
};

// Bits per element (4, 6, 8, 16, 32 or 64).
int dtype_bits(Dtype t);
// The format's name: "F32", "BF16", "BOOL", "F8_E4M3", ...
std::string_view dtype_name(Dtype t);
// Parses the format's name (exact, case-sensitive); nullopt for any other string.
std::optional<Dtype> dtype_from_name(std::string_view name);
// zero3's compute types in the format, and back (nullopt for a type zero3 does not compute in).
Dtype from_dtype(zero3::DType t);
std::optional<zero3::DType> to_dtype(Dtype t);

// The largest header accepted, as in the reference implementation (100,000,000 bytes).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor of a file. Offsets are relative to the data buffer (the byte after the header).
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  int64_t numel() const;  // product of shape; 1 for a scalar
  uint64_t nbytes() const { return data_end - data_begin; }
};

// "[2, 3]"
std::string shape_string(const std::vector<int64_t>& shape);

// One safetensors file, open for reading. The constructor reads and validates the whole header and the
// file size; afterwards the file may be read concurrently. Holds one file descriptor.
class SafetensorsReader {
 public:
  // Throws IoError (missing file, unreadable, or any rule of the format broken), naming the file.
  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The tensors in data-buffer order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* find(std::string_view name) const;
  // Throws IoError "<file>: no tensor '<name>'" when absent.
  const TensorInfo& tensor(std::string_view name) const;
  // The "__metadata__" strings (empty when the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }     // N
  uint64_t data_offset() const { return 8 + header_bytes_; }  // file offset of the data buffer
  uint64_t file_size() const { return file_size_; }

  // Copies elements [element_begin, element_end) of tensor `name` (flat, row-major) into `out`, which holds
  // (element_end - element_begin) * bits / 8 bytes, in the file's dtype and byte order (little-endian).
  // Reads exactly those bytes. Throws InvalidArgument for a range outside [0, numel] or not on a byte
  // boundary (sub-byte types), IoError for a missing tensor or a failed read. Blocks until done.
  void read_range(std::string_view name, int64_t element_begin, int64_t element_end, void* out) const;
  // Like read_range, converting f32, bf16, f16 or f64 elements to f32 (f64 rounds to nearest). `out` holds
  // element_end - element_begin floats. Throws Unsupported for any other dtype.
  void read_as_f32(std::string_view name, int64_t element_begin, int64_t element_end, float* out) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Validates a header held in memory: `header` is the N bytes after the length, `data_bytes` the size of the
// data buffer that follows it in the file. Returns the tensors in data-buffer order and fills `metadata`.
// Throws IoError prefixed with `label` (normally the file name). The reader's own validation; public so
// tools can check a header without a file.
std::vector<TensorInfo> parse_header(std::string_view header, uint64_t data_bytes, const std::string& label,
                                     std::map<std::string, std::string>* metadata = nullptr);

// A model stored as one safetensors file or as shards listed in an index. All shards are opened and
// validated by the constructor, and every tensor of the weight map is checked to be in its shard.
class ShardedSafetensorsReader {
 public:
  // `path` is one of: a .safetensors file; an index file (*.index.json); a directory holding
  // model.safetensors.index.json, or else model.safetensors, or else exactly one *.safetensors file.
  // Throws IoError naming the index, the missing shard, or the tensor that is not where the index says.
  explicit ShardedSafetensorsReader(const std::filesystem::path& path);

  // The index file, or the single file when there is no index.
  const std::filesystem::path& source() const { return source_; }
  size_t shard_count() const { return shards_.size(); }
  const SafetensorsReader& shard(size_t i) const { return shards_.at(i); }
  // Every tensor name of the model, sorted.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const TensorInfo* find(std::string_view name) const;
  // Throws IoError "<source>: no tensor '<name>'".
  const TensorInfo& tensor(std::string_view name) const;
  // The shard holding `name` (throws IoError like tensor()).
  const SafetensorsReader& shard_of(std::string_view name) const;

  // As SafetensorsReader's, on the shard holding `name`.
  void read_range(std::string_view name, int64_t element_begin, int64_t element_end, void* out) const;
  void read_as_f32(std::string_view name, int64_t element_begin, int64_t element_end, float* out) const;

 private:
  const SafetensorsReader* locate(std::string_view name) const;

  std::filesystem::path source_;
  std::vector<SafetensorsReader> shards_;
  std::unordered_map<std::string, size_t> shard_of_;  // tensor name -> index into shards_
};

// Fills out[0, end - begin) with elements [begin, end) of one parameter, as f32. The engine's pretrained
// init rule calls it once per rank with the rank's slice. May be called from several threads.
using F32RangeReader = std::function<void(int64_t begin, int64_t end, float* out)>;

// A reader of tensor `tensor_name` of `model`. When `expected_numel` >= 0 it is checked now against the
// tensor's element count (InvalidArgument naming both names and counts), so a wrong name map fails before
// training starts rather than on the first read. The model is kept alive by the returned function. The
// function throws InvalidArgument naming the tensor, the file and the first such element when the range it
// read holds NaN or Inf: a parameter that starts there makes every step's gradients non-finite.
F32RangeReader make_f32_reader(std::shared_ptr<const ShardedSafetensorsReader> model, std::string tensor_name,
                               int64_t expected_numel = -1);

// A tensor to be written: its name, type and shape; the bytes follow later.
struct TensorDecl {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<int64_t> shape;
};

// Bytes a declared tensor occupies (throws InvalidArgument on negative dims, overflow or a sub-byte size
// that does not end on a byte).
uint64_t tensor_bytes(const TensorDecl& decl);

// {"format": "pt"}: what PyTorch-side loaders (transformers) expect in "__metadata__".
std::map<std::string, std::string> default_metadata();

// Writes one safetensors file as a stream. The header is written by the constructor; then every declared
// tensor's bytes are given in declaration order (write/write_from_f32, any number of chunks per tensor);
// finish() checks that every byte came, fsyncs, and renames the file into place. A writer destroyed
// without finish() (an exception on the way) removes its temporary file and leaves `path` as it was.
class SafetensorsWriter {
 public:
  // Throws InvalidArgument (duplicate or reserved name, invalid UTF-8 in a name or metadata, bad shape) or
  // IoError (cannot create the temporary file in path's directory).
  SafetensorsWriter(std::filesystem::path path, std::vector<TensorDecl> tensors,
                    std::map<std::string, std::string> metadata = default_metadata());
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends `bytes` bytes of tensor `name`, which must be the tensor being written (or the next one once the
  // current is complete). Throws InvalidArgument naming the expected tensor when the order or the size is
  // wrong, IoError when the disk refuses.
  void write(std::string_view name, const void* data, size_t bytes);
  // Appends `count` elements of tensor `name`, converting from f32 to its dtype (f32, bf16, f16 with round
  // to nearest even, or f64). Throws Unsupported for other dtypes.
  void write_from_f32(std::string_view name, const float* data, int64_t count);
  // Checks completeness, flushes, fsyncs, renames into place and fsyncs the directory.
  void finish();

  const std::filesystem::path& path() const { return path_; }
  // Size of the complete file in bytes (known from the declarations).
  uint64_t file_size() const { return 8 + header_bytes_ + data_bytes_; }

 private:
  struct Impl;
  std::filesystem::path path_;
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

// Shard plan of a sharded save.
struct ShardPlan {
  std::string file_name;        // "model-00001-of-00004.safetensors", or "model.safetensors" if alone
  std::vector<size_t> tensors;  // indices into the declarations, in order
  uint64_t data_bytes = 0;      // sum of those tensors' bytes
};

// Splits declarations, kept in order, into shards of at most `max_shard_bytes` data bytes, as
// save_pretrained does: a tensor that does not fit in the current shard starts a new one, and a tensor
// larger than the limit gets a shard of its own. One shard is named "<prefix>.safetensors"; several are
// "<prefix>-%05d-of-%05d.safetensors".
std::vector<ShardPlan> plan_shards(const std::vector<TensorDecl>& tensors, uint64_t max_shard_bytes,
                                   const std::string& prefix = "model");

// Hugging Face's size strings: "5GB" = 5e9 bytes, "500MB", "10KB", "5GiB" = 5 * 2^30, "1.5GB", or a plain
// number of bytes. Throws InvalidArgument naming the string.
uint64_t parse_size(std::string_view text);

// Writes a model into `dir` (which must exist) as planned by plan_shards, then, when there are several
// shards, "<prefix>.safetensors.index.json" with {"metadata": {"total_size"}, "weight_map"}. Each file is
// atomic; the index is written last, so a reader that finds the index finds every shard it names. Files of
// an earlier save in `dir` with the same prefix and a different shard count are removed after the index is
// in place. Same write protocol as SafetensorsWriter: declaration order, chunks allowed.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(std::filesystem::path dir, std::vector<TensorDecl> tensors, uint64_t max_shard_bytes,
                           std::map<std::string, std::string> metadata = default_metadata(),
                           std::string prefix = "model");
  ~ShardedSafetensorsWriter();
  ShardedSafetensorsWriter(const ShardedSafetensorsWriter&) = delete;
  ShardedSafetensorsWriter& operator=(const ShardedSafetensorsWriter&) = delete;

  const std::vector<ShardPlan>& shards() const { return plan_; }
  void write(std::string_view name, const void* data, size_t bytes);
  void write_from_f32(std::string_view name, const float* data, int64_t count);
  // Finishes the last shard and writes the index. Throws InvalidArgument if a tensor is incomplete.
  void finish();

 private:
  SafetensorsWriter& writer_for(std::string_view name);

  std::filesystem::path dir_;
  std::vector<TensorDecl> decls_;
  std::map<std::string, std::string> metadata_;
  std::string prefix_;
  std::vector<ShardPlan> plan_;
  std::unordered_map<std::string, size_t> shard_of_;  // tensor name -> shard index
  size_t current_ = 0;                                // shard being written
  std::unique_ptr<SafetensorsWriter> writer_;
  bool finished_ = false;
};

}  // namespace zero3::safetensors

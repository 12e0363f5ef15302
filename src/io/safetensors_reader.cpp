// Reading safetensors files. The header is parsed by a SAX handler that knows the schema, so a hostile
// header is rejected as soon as it breaks a rule, with a message that names the tensor, and no JSON tree
// of attacker-chosen size or depth is ever built. The data is read by pread at offsets proven to lie
// inside the file before any read happens.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "io/file_util.hpp"
#include "io/safetensors_detail.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace zero3::safetensors {

using detail::printable;
using detail::short_shape;

int64_t TensorInfo::numel() const { return detail::checked_numel(shape).value_or(-1); }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

namespace {

using json = nlohmann::json;

// Builds the tensor list from SAX events of the header JSON. Any rule broken sets error_ and stops the
// parse (a handler returning false ends nlohmann's parser).
class HeaderSax {
 public:
  explicit HeaderSax(std::map<std::string, std::string>* metadata) : metadata_(metadata) {}

  std::vector<TensorInfo>& tensors() { return tensors_; }
  const std::string& error() const { return error_; }

  bool null() { return scalar(Kind::null); }
  bool boolean(bool) { return scalar(Kind::boolean); }
  bool number_integer(json::number_integer_t) { return scalar(Kind::negative); }
  bool number_unsigned(json::number_unsigned_t v) {
    unsigned_ = v;
    return scalar(Kind::unsigned_integer);
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(Kind::fraction); }
  bool string(json::string_t& v) {
    string_ = &v;
    return scalar(Kind::string);
  }
  bool binary(json::binary_t&) { return scalar(Kind::fraction); }  // never produced by the JSON parser

  bool start_object(std::size_t) { return open(Kind::object); }
  bool start_array(std::size_t) { return open(Kind::array); }

  bool key(json::string_t& k) {
    if (skip_ > 0) return true;
    switch (top()) {
      case Frame::root:
        if (!names_.insert(k).second) return fail("the header names " + printable(k) + " twice (duplicate JSON key)");
        key_ = std::move(k);
        return true;
      case Frame::metadata:
        if (metadata_keys_.count(k)) return fail("__metadata__ has the key " + printable(k) + " twice");
        metadata_keys_.insert(k);
        metadata_key_ = std::move(k);
        return true;
      case Frame::tensor: {
        Field f = k == "dtype"          ? Field::dtype
                  : k == "shape"        ? Field::shape
                  : k == "data_offsets" ? Field::offsets
                                        : Field::other;
        if (f != Field::other) {
          bool& seen = f == Field::dtype ? seen_dtype_ : f == Field::shape ? seen_shape_ : seen_offsets_;
          if (seen) return fail_tensor("has the key " + printable(k) + " twice");
          seen = true;
        }
        field_ = f;
        return true;
      }
      default:
        return fail("unexpected key " + printable(k));  // the JSON grammar puts keys only in objects
    }
  }

  bool end_object() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (top() == Frame::tensor && !finish_tensor()) return false;
    stack_.pop_back();
    return true;
  }

  bool end_array() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (top() == Frame::offsets && offsets_count_ != 2) {
      return fail_tensor("data_offsets has " + std::to_string(offsets_count_) + " entries; expected [begin, end]");
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    // nlohmann's message quotes the bytes it last read, which come from the file: escape them.
    std::string what = ex.what();
    error_ = "the header is not valid JSON (at byte " + std::to_string(position) +
             "): " + printable(what, /*ascii_only=*/true);
    return false;
  }

 private:
  enum class Frame { none, root, metadata, tensor, shape, offsets };
  enum class Field { dtype, shape, offsets, other };
  enum class Kind { null, boolean, negative, unsigned_integer, fraction, string, object, array };

  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::null:
        return "null";
      case Kind::boolean:
        return "a boolean";
      case Kind::negative:
        return "a negative number";
      case Kind::unsigned_integer:
        return "an integer";
      case Kind::fraction:
        return "a non-integer number";
      case Kind::string:
        return "a string";
      case Kind::object:
        return "an object";
      case Kind::array:
        return "an array";
    }
    return "?";
  }

  Frame top() const { return stack_.empty() ? Frame::none : stack_.back(); }

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }
  bool fail_tensor(const std::string& message) { return fail("tensor " + printable(current_.name) + " " + message); }

  bool open(Kind kind) {
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    return value(kind);
  }
  bool scalar(Kind kind) {
    if (skip_ > 0) return true;
    return value(kind);
  }

  bool value(Kind kind) {
    switch (top()) {
      case Frame::none:
        if (kind != Kind::object) return fail(std::string("the header is ") + kind_name(kind) + ", not a JSON object");
        stack_.push_back(Frame::root);
        return true;
      case Frame::root:
        if (key_ == "__metadata__") {
          if (kind == Kind::null) return true;  // the reference implementation reads null as "no metadata"
          if (kind != Kind::object) {
            return fail(std::string("__metadata__ is ") + kind_name(kind) + "; expected an object of strings");
          }
          stack_.push_back(Frame::metadata);
          return true;
        }
        current_ = TensorInfo{};
        current_.name = key_;
        if (kind != Kind::object) {
          return fail_tensor(std::string("is ") + kind_name(kind) +
                             "; expected an object with dtype, shape and data_offsets");
        }
        seen_dtype_ = seen_shape_ = seen_offsets_ = false;
        dtype_name_.clear();
        offsets_count_ = 0;
        stack_.push_back(Frame::tensor);
        return true;
      case Frame::metadata:
        if (kind != Kind::string) {
          return fail("__metadata__[" + printable(metadata_key_) + "] is " + kind_name(kind) +
                      "; every __metadata__ value must be a string");
        }
        if (metadata_) (*metadata_)[metadata_key_] = std::move(*string_);
        return true;
      case Frame::tensor:
        switch (field_) {
          case Field::dtype:
            if (kind != Kind::string) return fail_tensor(std::string("has a dtype that is ") + kind_name(kind));
            dtype_name_ = std::move(*string_);
            return true;
          case Field::shape:
            if (kind != Kind::array) return fail_tensor(std::string("has a shape that is ") + kind_name(kind));
            stack_.push_back(Frame::shape);
            return true;
          case Field::offsets:
            if (kind != Kind::array) {
              return fail_tensor(std::string("has data_offsets that are ") + kind_name(kind));
            }
            stack_.push_back(Frame::offsets);
            return true;
          case Field::other:
            // Keys the format does not define are ignored, as the reference implementation does.
            if (kind == Kind::object || kind == Kind::array) skip_ = 1;
            return true;
        }
        return true;
      case Frame::shape:
        if (kind != Kind::unsigned_integer) {
          return fail_tensor(std::string("has a shape holding ") + kind_name(kind) +
                             "; dimensions are non-negative integers");
        }
        if (unsigned_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return fail_tensor("has a dimension " + std::to_string(unsigned_) + " larger than 2^63 - 1");
        }
        current_.shape.push_back(static_cast<int64_t>(unsigned_));
        return true;
      case Frame::offsets:
        if (kind != Kind::unsigned_integer) {
          return fail_tensor(std::string("has data_offsets holding ") + kind_name(kind) +
                             "; offsets are non-negative integers");
        }
        if (offsets_count_ == 2) return fail_tensor("has more than two data_offsets; expected [begin, end]");
        (offsets_count_ == 0 ? current_.data_begin : current_.data_end) = unsigned_;
        ++offsets_count_;
        return true;
    }
    return fail("internal: unknown parser state");
  }

  bool finish_tensor() {
    if (!seen_dtype_) return fail_tensor("has no \"dtype\"");
    if (!seen_shape_) return fail_tensor("has no \"shape\"");
    if (!seen_offsets_) return fail_tensor("has no \"data_offsets\"");
    std::optional<Dtype> dtype = dtype_from_name(dtype_name_);
    if (!dtype) return fail_tensor("has the unknown dtype " + printable(dtype_name_));
    current_.dtype = *dtype;
    const std::string offsets =
        "data_offsets [" + std::to_string(current_.data_begin) + ", " + std::to_string(current_.data_end) + "]";
    if (current_.data_end < current_.data_begin) return fail_tensor("has " + offsets + " that end before they begin");
    std::optional<int64_t> numel = detail::checked_numel(current_.shape);
    std::optional<uint64_t> bits = numel ? detail::checked_bits(*numel, dtype_bits(*dtype)) : std::nullopt;
    if (!bits) {
      return fail_tensor("has shape " + short_shape(current_.shape) + " of " + std::string(dtype_name(*dtype)) +
                         " whose size overflows 64 bits");
    }
    if (*bits % 8 != 0) {
      return fail_tensor("has shape " + short_shape(current_.shape) + " of " + std::string(dtype_name(*dtype)) + ": " +
                         std::to_string(*numel) + " elements do not fill whole bytes");
    }
    if (*bits / 8 != current_.nbytes()) {
      return fail_tensor("has " + offsets + " holding " + std::to_string(current_.nbytes()) + " bytes, but shape " +
                         short_shape(current_.shape) + " of " + std::string(dtype_name(*dtype)) + " needs " +
                         std::to_string(*bits / 8) + " bytes");
    }
    tensors_.push_back(std::move(current_));
    return true;
  }

  std::map<std::string, std::string>* metadata_;
  std::vector<TensorInfo> tensors_;
  std::string error_;

  std::vector<Frame> stack_;  // at most 3 deep: root, tensor, shape/offsets
  uint64_t skip_ = 0;         // nesting depth inside a value that is being ignored
  std::unordered_set<std::string> names_;
  std::unordered_set<std::string> metadata_keys_;
  std::string key_;
  std::string metadata_key_;
  Field field_ = Field::other;
  TensorInfo current_;
  std::string dtype_name_;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  int offsets_count_ = 0;
  uint64_t unsigned_ = 0;
  json::string_t* string_ = nullptr;
};

// Round to nearest even, with magnitudes from halfway above FLT_MAX on becoming infinities (a plain cast of
// an out-of-range double is undefined behaviour).
float f64_to_f32(double d) {
  constexpr double kOverflow = 0x1.ffffffp127;  // FLT_MAX + half an ulp: ties go to the even infinity
  if (d >= kOverflow) return std::numeric_limits<float>::infinity();
  if (d <= -kOverflow) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);  // NaN stays NaN
}

std::string range_text(const TensorInfo& t) {
  return "[" + std::to_string(t.data_begin) + ", " + std::to_string(t.data_end) + "]";
}

}  // namespace

std::vector<TensorInfo> parse_header(std::string_view header, uint64_t data_bytes, const std::string& label,
                                     std::map<std::string, std::string>* metadata) {
  if (header.empty()) throw IoError(label + ": the header is empty (its length field is 0)");
  if (header.front() != '{') {
    throw IoError(label + ": the header does not start with '{' (it starts with byte " +
                  printable(header.substr(0, 1), true) + ")");
  }
  // JSON has no raw NUL anywhere, and nlohmann's lexer would take one as the end of the input and accept
  // whatever follows it unseen.
  if (size_t nul = header.find('\0'); nul != std::string_view::npos) {
    throw IoError(label + ": the header holds a NUL byte at offset " + std::to_string(nul) +
                  " (JSON allows none; padding must be spaces)");
  }
  std::map<std::string, std::string> scratch;
  HeaderSax sax(metadata ? metadata : &scratch);
  bool ok = json::sax_parse(header.begin(), header.end(), &sax, json::input_format_t::json, /*strict=*/true,
                            /*ignore_comments=*/false);
  if (!ok) throw IoError(label + ": " + sax.error());
  std::vector<TensorInfo> tensors = std::move(sax.tensors());

  // The tensors must tile the data buffer exactly: sorted by offset, each begins where the previous ends,
  // and the last ends at the end of the file.
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.data_begin > pos) {
      throw IoError(label + ": bytes [" + std::to_string(pos) + ", " + std::to_string(t.data_begin) +
                    ") of the data buffer belong to no tensor (a hole " +
                    (prev ? "between tensor " + printable(prev->name) + " and " : std::string("before ")) + "tensor " +
                    printable(t.name) + ")");
    }
    if (t.data_begin < pos) {
      throw IoError(label + ": tensor " + printable(t.name) + " (data_offsets " + range_text(t) + ") overlaps tensor " +
                    printable(prev->name) + " (data_offsets " + range_text(*prev) + ")");
    }
    if (t.data_end > data_bytes) {
      throw IoError(label + ": tensor " + printable(t.name) + " (data_offsets " + range_text(t) +
                    ") runs past the end of the file, whose data buffer holds only " + std::to_string(data_bytes) +
                    " bytes (truncated file?)");
    }
    pos = t.data_end;
    prev = &t;
  }
  if (pos != data_bytes) {
    throw IoError(label + ": the data buffer holds " + std::to_string(data_bytes) + " bytes but the tensors cover " +
                  std::to_string(pos) + "; the last " + std::to_string(data_bytes - pos) +
                  " bytes belong to no tensor");
  }
  return tensors;
}

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path) : path_(path) {
  io::FileDescriptor fd = io::open_read(path_);
  const std::string label = path_.string();
  file_size_ = io::file_size(fd.get(), path_);
  if (file_size_ < 8) {
    throw IoError(label + ": the file is " + std::to_string(file_size_) +
                  " bytes, too short for the 8-byte header length of a safetensors file");
  }
  unsigned char len[8];
  io::pread_exact(fd.get(), len, 8, 0, path_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kMaxHeaderBytes) {
    throw IoError(label + ": the header length field says " + std::to_string(n) + " bytes, more than the " +
                  std::to_string(kMaxHeaderBytes) + "-byte limit (not a safetensors file, or a corrupt one)");
  }
  if (n > file_size_ - 8) {
    throw IoError(label + ": the header length field says " + std::to_string(n) + " bytes but the file has only " +
                  std::to_string(file_size_ - 8) + " bytes after it (truncated file?)");
  }
  header_bytes_ = n;
  std::string header(n, '\0');
  io::pread_exact(fd.get(), header.data(), n, 8, path_);
  tensors_ = parse_header(header, file_size_ - 8 - n, label, &metadata_);
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  fd_ = fd.release();
}

SafetensorsReader::~SafetensorsReader() { io::FileDescriptor close_it(fd_); }

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      header_bytes_(other.header_bytes_),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    io::FileDescriptor close_it(std::exchange(fd_, std::exchange(other.fd_, -1)));
    path_ = std::move(other.path_);
    file_size_ = other.file_size_;
    header_bytes_ = other.header_bytes_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const TensorInfo* SafetensorsReader::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsReader::tensor(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) throw IoError(path_.string() + ": no tensor " + printable(name));
  return *t;
}

namespace {

// Byte range [first, last) of elements [begin, end) of `t`, validated.
std::pair<uint64_t, uint64_t> element_bytes(const TensorInfo& t, int64_t begin, int64_t end,
                                            const std::filesystem::path& path) {
  const int64_t numel = t.numel();
  if (begin < 0 || end < begin || end > numel) {
    throw InvalidArgument("element range [" + std::to_string(begin) + ", " + std::to_string(end) + ") of tensor " +
                          printable(t.name) + " in " + path.string() + " is outside its " + std::to_string(numel) +
                          " elements (shape " + shape_string(t.shape) + ")");
  }
  // numel * bits fits in 64 bits (checked when the header was read), so these products do too.
  const auto bits = static_cast<uint64_t>(dtype_bits(t.dtype));
  const uint64_t first_bit = static_cast<uint64_t>(begin) * bits;
  const uint64_t last_bit = static_cast<uint64_t>(end) * bits;
  if (first_bit % 8 != 0 || last_bit % 8 != 0) {
    throw InvalidArgument("element range [" + std::to_string(begin) + ", " + std::to_string(end) + ") of tensor " +
                          printable(t.name) + " (" + std::string(dtype_name(t.dtype)) + ") in " + path.string() +
                          " does not start and end on byte boundaries");
  }
  return {first_bit / 8, last_bit / 8};
}

}  // namespace

void SafetensorsReader::read_range(std::string_view name, int64_t element_begin, int64_t element_end, void* out) const {
  const TensorInfo& t = tensor(name);
  auto [first, last] = element_bytes(t, element_begin, element_end, path_);
  if (last == first) return;
  io::pread_exact(fd_, out, last - first, data_offset() + t.data_begin + first, path_);
}

void SafetensorsReader::read_as_f32(std::string_view name, int64_t element_begin, int64_t element_end,
                                    float* out) const {
  const TensorInfo& t = tensor(name);
  if (t.dtype == Dtype::f32) return read_range(name, element_begin, element_end, out);
  if (t.dtype != Dtype::bf16 && t.dtype != Dtype::f16 && t.dtype != Dtype::f64) {
    throw Unsupported("read_as_f32 does not support dtype " + std::string(dtype_name(t.dtype)) + " (tensor " +
                      printable(t.name) + " in " + path_.string() + "); it converts F32, BF16, F16 and F64");
  }
  auto [first, last] = element_bytes(t, element_begin, element_end, path_);
  const size_t elem = static_cast<size_t>(dtype_bits(t.dtype) / 8);
  // Convert through a bounded staging buffer so that a rank reading a large slice needs no second copy of it.
  constexpr size_t kChunkBytes = size_t{1} << 20;
  std::vector<unsigned char> staging(std::min<uint64_t>(kChunkBytes, last - first));
  uint64_t done = first;
  float* dst = out;
  while (done < last) {
    const size_t bytes = static_cast<size_t>(std::min<uint64_t>(staging.size(), last - done));
    io::pread_exact(fd_, staging.data(), bytes, data_offset() + t.data_begin + done, path_);
    const size_t count = bytes / elem;
    const unsigned char* src = staging.data();
    if (t.dtype == Dtype::bf16) {
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
    } else if (t.dtype == Dtype::f16) {
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = f64_to_f32(d);
      }
    }
    dst += count;
    done += bytes;
  }
}

}  // namespace zero3::safetensors

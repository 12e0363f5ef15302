// libFuzzer target for the safetensors reader. Each input is a whole file. The reader must either reject
// it with a zero3 error or accept it; an accepted file must satisfy the format's invariants, every byte of
// every tensor must read back, and writing the same tensors again must give a file that reads back equal.
// Any crash, sanitizer report or broken invariant is a bug. docs/safetensors.md says how to run it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"

namespace st = zero3::safetensors;

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

// An in-memory file holding the current input, reopened by path like any model file.
struct InputFile {
  InputFile() {
    fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) broken("memfd_create", std::strerror(errno));
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  void set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd, 0) != 0) broken("ftruncate", std::strerror(errno));
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) broken("pwrite", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }
  int fd;
  std::string path;
};

// Where the round-trip copies go: tmpfs when there is one, so that fsync costs nothing.
std::string scratch_dir() {
  const char* env = std::getenv("ZERO3_FUZZ_TMP");
  if (env) return env;
  return ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
}

std::vector<unsigned char> read_all(const st::SafetensorsReader& r, const st::TensorInfo& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  r.read_range(t.name, 0, t.numel(), bytes.data());
  return bytes;
}

void check_accepted(const st::SafetensorsReader& r, const uint8_t* data, size_t size) {
  uint64_t pos = 0;
  for (const st::TensorInfo& t : r.tensors()) {
    if (t.data_begin != pos) broken("tensors tile the buffer", t.name);
    pos = t.data_end;
    if (t.numel() < 0) broken("numel fits", t.name);
    std::vector<unsigned char> bytes = read_all(r, t);
    if (t.nbytes() && std::memcmp(bytes.data(), data + r.data_offset() + t.data_begin, t.nbytes()) != 0) {
      broken("read_range returns the file's bytes", t.name);
    }
    const bool floating = t.dtype == st::Dtype::f32 || t.dtype == st::Dtype::bf16 || t.dtype == st::Dtype::f16 ||
                          t.dtype == st::Dtype::f64;
    if (floating) {
      std::vector<float> f(static_cast<size_t>(t.numel()));
      r.read_as_f32(t.name, t.numel() / 3, t.numel(), f.data());
    }
  }
  if (r.data_offset() + pos != size) broken("tensors end at end of file", std::to_string(pos));
}

void round_trip(const st::SafetensorsReader& r) {
  std::vector<st::TensorDecl> decls;
  for (const st::TensorInfo& t : r.tensors()) {
    if (t.name.empty()) return;  // accepted by the format, refused by our writer
    decls.push_back({t.name, t.dtype, t.shape});
  }
  const std::string path = scratch_dir() + "/zero3-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  {
    st::SafetensorsWriter w(path, decls, r.metadata());
    for (const st::TensorInfo& t : r.tensors()) {
      std::vector<unsigned char> bytes = read_all(r, t);
      // Two chunks, to exercise the streaming path.
      const size_t half = bytes.size() / 2;
      w.write(t.name, bytes.data(), half);
      w.write(t.name, bytes.data() + half, bytes.size() - half);
    }
    w.finish();
  }
  st::SafetensorsReader again(path);
  if (again.metadata() != r.metadata()) broken("metadata round-trips", path);
  if (again.tensors().size() != r.tensors().size()) broken("tensor count round-trips", path);
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const st::TensorInfo &a = r.tensors()[i], &b = again.tensors()[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.data_begin != b.data_begin ||
        a.data_end != b.data_end || read_all(r, a) != read_all(again, b)) {
      broken("tensor round-trips", a.name);
    }
  }
  ::unlink(path.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zero3::log::set_level(zero3::LogLevel::error);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static InputFile input;
  input.set(data, size);
  std::optional<st::SafetensorsReader> reader;
  try {
    reader.emplace(input.path);
  } catch (const zero3::IoError&) {
    return 0;  // rejected: the expected outcome for most inputs
  }
  check_accepted(*reader, data, size);
  round_trip(*reader);
  return 0;
}

// Crash-safe file replacement: write under a temporary name in the destination's directory, fsync, rename
// over the destination, fsync the directory. After a crash at any point the destination holds either its
// old content (or does not exist) or the complete new content, never a mix. The checkpoint writer uses the
// same primitives for whole directories (durable_rename of a directory written elsewhere).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "io/file_util.hpp"

namespace zero3::io {

// fsync(2) of a directory, so that entries created, renamed or removed in it survive a crash.
void fsync_directory(const std::filesystem::path& dir);

// rename(2) `from` to `to` (files or directories on one file system; `to` is replaced if it is a file or an
// empty directory), then fsync the parent directories of both. Throws IoError naming both paths.
void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);

// A file that appears at `path` only when commit() succeeds. Until then it lives at temp_path(), a hidden
// name beside `path` (".<name>.tmp-<pid>-<n>"), created with O_EXCL. Destroying it without commit() removes
// the temporary file. One thread at a time.
class AtomicFile {
 public:
  // Creates the temporary file (mode 0644 minus umask). Throws IoError when the directory is missing or not
  // writable.
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }
  int fd() const { return fd_.get(); }

  // Appends at the current position.
  void write(const void* data, size_t size);
  // Writes at an absolute offset (the file position is unchanged).
  void pwrite(const void* data, size_t size, uint64_t offset);
  // fsync, close, rename to path(), fsync the directory. After it, the object holds nothing.
  void commit();
  // Removes the temporary file now; path() is untouched. Safe to call twice.
  void abandon() noexcept;
  bool committed() const { return committed_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  FileDescriptor fd_;
  bool committed_ = false;
};

// Writes `contents` to `path` through an AtomicFile.
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace zero3::io

// POSIX file primitives with zero3's error contract: every failure is an IoError naming the file, the offset
// and size where relevant, and errno's text. Short reads/writes and EINTR are retried.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace zero3::io {

// An owned file descriptor, closed on destruction (a failed close is logged, never thrown).
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// open(2) for reading, O_CLOEXEC. Throws IoError "cannot open <path> for reading: <strerror>".
FileDescriptor open_read(const std::filesystem::path& path);

// Size of an open file (fstat).
uint64_t file_size(int fd, const std::filesystem::path& path);

// Reads exactly `size` bytes at `offset`. A file that ends first is an IoError naming the file, the offset,
// the size asked for and the bytes it had.
void pread_exact(int fd, void* out, size_t size, uint64_t offset, const std::filesystem::path& path);

// Writes all `size` bytes at the current position / at `offset`.
void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);
void pwrite_all(int fd, const void* data, size_t size, uint64_t offset, const std::filesystem::path& path);

// fsync(2) of an open file.
void fsync_fd(int fd, const std::filesystem::path& path);

}  // namespace zero3::io

#include "io/file_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::io {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void FileDescriptor::reset(int fd) {
  if (fd_ >= 0 && ::close(fd_) != 0) {
    // close() after a successful fsync cannot lose data we promised; report and go on.
    log::warn("close(fd ", fd_, ") failed: ", errno_text(errno));
  }
  fd_ = fd;
}

FileDescriptor open_read(const std::filesystem::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw IoError("cannot open " + path.string() + " for reading: " + errno_text(errno));
  return FileDescriptor(fd);
}

uint64_t file_size(int fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError("fstat of " + path.string() + " failed: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw IoError(path.string() + " is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void pread_exact(int fd, void* out, size_t size, uint64_t offset, const std::filesystem::path& path) {
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("reading " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " +
                    path.string() + " failed: " + errno_text(errno));
    }
    if (n == 0) {
      throw IoError("reading " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " +
                    path.string() + ": the file ends after " + std::to_string(done) + " of them (truncated?)");
    }
    done += static_cast<size_t>(n);
  }
}

void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path) {
  auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("writing " + std::to_string(size - done) + " bytes to " + path.string() +
                    " failed: " + errno_text(errno));
    }
    if (n == 0) throw IoError("writing to " + path.string() + " made no progress");
    done += static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, const void* data, size_t size, uint64_t offset, const std::filesystem::path& path) {
  auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("writing " + std::to_string(size - done) + " bytes at offset " + std::to_string(offset + done) +
                    " of " + path.string() + " failed: " + errno_text(errno));
    }
    if (n == 0) throw IoError("writing to " + path.string() + " made no progress");
    done += static_cast<size_t>(n);
  }
}

void fsync_fd(int fd, const std::filesystem::path& path) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw IoError("fsync of " + path.string() + " failed: " + errno_text(errno));
}

}  // namespace zero3::io

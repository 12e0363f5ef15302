#include "io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::io {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

std::filesystem::path parent_or_dot(const std::filesystem::path& p) {
  std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

void fsync_directory(const std::filesystem::path& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw IoError("cannot open directory " + dir.string() + " to fsync it: " + errno_text(errno));
  FileDescriptor owned(fd);
  fsync_fd(owned.get(), dir);
}

void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw IoError("rename " + from.string() + " -> " + to.string() + " failed: " + errno_text(errno));
  }
  std::filesystem::path to_parent = parent_or_dot(to);
  std::filesystem::path from_parent = parent_or_dot(from);
  fsync_directory(to_parent);
  std::error_code ec;
  if (!std::filesystem::equivalent(from_parent, to_parent, ec)) fsync_directory(from_parent);
}

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  if (path_.filename().empty()) throw IoError("cannot write a file at " + path_.string() + ": no file name");
  std::filesystem::path dir = parent_or_dot(path_);
  const std::string base = "." + path_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-";
  for (int attempt = 0;; ++attempt) {
    temp_path_ = dir / (base + std::to_string(g_temp_counter.fetch_add(1)));
    int fd = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      fd_.reset(fd);
      return;
    }
    // A leftover of an earlier process with our pid: take the next number.
    if (errno == EEXIST && attempt < 1000) continue;
    if (errno == EINTR) continue;
    throw IoError("cannot create " + temp_path_.string() + " (the temporary file for " + path_.string() +
                  "): " + errno_text(errno));
  }
}

AtomicFile::~AtomicFile() { abandon(); }

void AtomicFile::write(const void* data, size_t size) {
  if (!fd_.valid()) throw IoError("write to " + path_.string() + " after commit or abandon");
  write_all(fd_.get(), data, size, temp_path_);
}

void AtomicFile::pwrite(const void* data, size_t size, uint64_t offset) {
  if (!fd_.valid()) throw IoError("write to " + path_.string() + " after commit or abandon");
  pwrite_all(fd_.get(), data, size, offset, temp_path_);
}

void AtomicFile::commit() {
  if (!fd_.valid()) throw IoError("commit of " + path_.string() + " after commit or abandon");
  fsync_fd(fd_.get(), temp_path_);
  int fd = fd_.release();
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(temp_path_.c_str());
    throw IoError("close of " + temp_path_.string() + " failed: " + errno_text(err));
  }
  try {
    durable_rename(temp_path_, path_);
  } catch (...) {
    ::unlink(temp_path_.c_str());
    throw;
  }
  committed_ = true;
}

void AtomicFile::abandon() noexcept {
  if (committed_ || temp_path_.empty()) return;
  fd_.reset();
  if (::unlink(temp_path_.c_str()) != 0 && errno != ENOENT) {
    log::warn("could not remove the temporary file ", temp_path_.string(), ": ", errno_text(errno));
  }
  temp_path_.clear();
}

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace zero3::io

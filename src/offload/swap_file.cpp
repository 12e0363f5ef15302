#include "offload/swap_file.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "io/aligned_buffer.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::offload {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// "123 bytes (1.00 GiB)"
std::string gib(uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1ull << 20));
  }
  return std::to_string(bytes) + " bytes (" + buf + ")";
}

void check_tier(const std::string& tier) {
  bool ok = !tier.empty();
  for (char c : tier) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  if (!ok) throw ConfigError("swap file tier \"" + tier + "\": expected letters, digits, '_' or '-'");
}

void check_directory(const std::string& dir) {
  if (dir.empty()) {
    throw ConfigError("nvme_path is empty: NVMe offload needs a directory on a local disk (or set ZERO3_SWAP_DIR)");
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    throw IoError("nvme_path " + dir + " " + (err == ENOENT ? "does not exist" : "cannot be examined") + ": " +
                  errno_text(err) + "; create it on a local NVMe disk before starting");
  }
  if (!S_ISDIR(st.st_mode)) throw IoError("nvme_path " + dir + " is not a directory");
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
    throw IoError("nvme_path " + dir + " is on " + (fs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs") +
                  ", a memory file system without real O_DIRECT (direct I/O): the kernel refuses it or emulates it "
                  "through the page cache, and swapping to memory defeats NVMe offload. Use a directory on a "
                  "local disk (ext4, xfs)");
  }
}

// Creates a probe file with O_DIRECT, writes one aligned block, reads it back and removes it.
void probe_direct_io(const std::string& dir, int rank) {
  std::string probe = dir + "/.zero3-preflight-rank" + std::to_string(rank) + "-" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    ::unlink(probe.c_str());
    fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    int err = errno;
    if (err == EINVAL) {
      throw IoError("nvme_path " + dir + ": the file system does not support O_DIRECT (direct I/O): opening " + probe +
                    " with O_DIRECT failed: " + errno_text(err) + ". Use a directory on a local disk");
    }
    if (err == EACCES || err == EPERM || err == EROFS) {
      throw IoError("nvme_path " + dir + " is not writable: creating " + probe + " failed: " + errno_text(err) +
                    (err == EROFS ? "; the file system is mounted read-only" : "; check its permissions"));
    }
    throw IoError("nvme_path " + dir + ": creating the probe file " + probe + " failed: " + errno_text(err));
  }
  io::AlignedBuffer out(io::kDirectIoAlignment), in(io::kDirectIoAlignment);
  for (size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<std::byte>(i * 7 + 1);
  std::string failure;
  ssize_t w = ::pwrite(fd, out.data(), out.size(), 0);
  if (w != static_cast<ssize_t>(out.size())) {
    failure = "an O_DIRECT write of 4096 bytes to " + probe +
              " failed: " + (w < 0 ? errno_text(errno) : "wrote " + std::to_string(w) + " bytes");
  } else {
    ssize_t r = ::pread(fd, in.data(), in.size(), 0);
    if (r != static_cast<ssize_t>(in.size())) {
      failure = "an O_DIRECT read of 4096 bytes from " + probe +
                " failed: " + (r < 0 ? errno_text(errno) : "read " + std::to_string(r) + " bytes");
    } else if (std::memcmp(in.data(), out.data(), in.size()) != 0) {
      failure = "an O_DIRECT block written to " + probe + " read back different";
    }
  }
  ::close(fd);
  ::unlink(probe.c_str());
  if (!failure.empty()) throw IoError("nvme_path " + dir + ": " + failure);
}

void check_space(const std::string& dir, uint64_t bytes, const std::string& what) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    throw IoError("nvme_path " + dir + ": statvfs failed: " + errno_text(errno));
  }
  uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  uint64_t need = bytes + swap_space_margin(bytes);
  if (avail < need) {
    throw IoError("nvme_path " + dir + " has " + gib(avail) + " free; " + what + " needs " + gib(bytes) +
                  " plus a margin of " + gib(swap_space_margin(bytes)) +
                  ". Free space there, use a larger disk, or offload less (max_in_cpu, offload_param)");
  }
}

}  // namespace

uint64_t swap_space_margin(uint64_t bytes) { return bytes / 100 + (uint64_t{64} << 20); }

std::string swap_file_path(const std::string& dir, const std::string& tier, int rank) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d + "/zero3-swap-" + tier + "-rank" + std::to_string(rank) + ".bin";
}

void swap_preflight(const SwapFileSpec& spec) {
  check_tier(spec.tier);
  if (spec.largest_tile > 0 && spec.buffer_bytes > 0 &&
      spec.buffer_bytes < io::align_up(spec.largest_tile, io::kDirectIoAlignment)) {
    throw ConfigError(spec.buffer_key + ": a staging buffer of " + std::to_string(spec.buffer_bytes) +
                      " bytes cannot hold the largest " + spec.tier + " tile of " + std::to_string(spec.largest_tile) +
                      " bytes (" + std::to_string(io::align_up(spec.largest_tile, io::kDirectIoAlignment)) +
                      " with O_DIRECT padding); raise it or lower zero_optimization.sub_group_size");
  }
  check_directory(spec.dir);
  probe_direct_io(spec.dir, spec.rank);
  std::string what = "the " + spec.tier + " swap file of rank " + std::to_string(spec.rank);
  // A stale swap file at our own path is about to be removed, so its blocks count as free.
  struct stat st {};
  uint64_t reclaim = 0;
  if (::stat(swap_file_path(spec.dir, spec.tier, spec.rank).c_str(), &st) == 0) {
    reclaim = static_cast<uint64_t>(st.st_blocks) * 512;
  }
  uint64_t bytes = io::align_up(spec.bytes, io::kDirectIoAlignment);
  check_space(spec.dir, bytes > reclaim ? bytes - reclaim : 0, what);
}

SwapFile::SwapFile(const SwapFileSpec& spec)
    : path_(swap_file_path(spec.dir, spec.tier, spec.rank)),
      tier_(spec.tier),
      rank_(spec.rank),
      size_(io::align_up(spec.bytes, io::kDirectIoAlignment)) {
  check_tier(spec.tier);
  check_directory(spec.dir);
  if (::unlink(path_.c_str()) == 0) {
    log::info("removed the stale swap file ", path_, " of an earlier run");
  } else if (errno != ENOENT) {
    int err = errno;
    throw IoError("cannot remove the stale swap file " + path_ + ": " + errno_text(err));
  }
  swap_preflight(spec);
  // O_EXCL: two processes given the same rank would otherwise share one file silently.
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    throw IoError(
        "cannot create the swap file " + path_ + ": " + errno_text(err) +
        (err == EEXIST ? "; another process with rank " + std::to_string(rank_) + " uses the same nvme_path" : ""));
  }
  ::close(fd);
  try {
    file_ = io::IoFile::open(path_, io::IoFile::Mode::read_write, /*direct=*/true);
    if (size_ > 0) {
      int rc;
      if (::fallocate(file_.fd(), 0, 0, static_cast<off_t>(size_)) == 0) {
        rc = 0;
      } else if (errno == EOPNOTSUPP) {
        rc = ::posix_fallocate(file_.fd(), 0, static_cast<off_t>(size_));
      } else {
        rc = errno;
      }
      if (rc != 0) {
        std::string hint = rc == ENOSPC  ? "; the disk is full (other ranks or programs may share it)"
                           : rc == EFBIG ? "; the file size limit (ulimit -f) or the file system's maximum is lower"
                                         : "";
        throw IoError("cannot preallocate " + gib(size_) + " for the swap file " + path_ + ": " + errno_text(rc) +
                      hint);
      }
    }
  } catch (...) {
    file_.close();
    ::unlink(path_.c_str());
    throw;
  }
  log::debug("swap file ", path_, ": ", gib(size_), " preallocated, O_DIRECT");
}

SwapFile::~SwapFile() {
  file_.close();
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    log::warn("cannot remove the swap file ", path_, ": ", std::strerror(errno));
  }
}

}  // namespace zero3::offload

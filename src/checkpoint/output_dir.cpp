// check_output_directory: the start-up check of a directory a run will write into (checkpoint.hpp).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <system_error>

#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

namespace fs = std::filesystem;

std::string bytes_text(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu bytes (%.2f GiB)", static_cast<unsigned long long>(bytes),
                static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30));
  return buf;
}

std::string kind_of(fs::file_type type) {
  switch (type) {
    case fs::file_type::regular:
      return "a regular file";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "a file of another kind";
  }
}

// A file name no other rank or run picks at the same moment, even on a shared file system.
std::string probe_name() {
  char host[64] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[160];
  std::snprintf(buf, sizeof buf, ".zero3-write-check-%s-%d-%08x%08llx", host, static_cast<int>(::getpid()), rd(),
                static_cast<unsigned long long>(t & 0xffffffffu));
  return buf;
}

}  // namespace

void check_output_directory(const fs::path& dir, const std::string& what, uint64_t bytes_needed,
                            const std::string& needed_for) {
  const std::string name = what + " " + dir.string();
  auto fail = [&](const std::string& why) { throw CheckpointError(name + ": " + why); };
  if (dir.empty()) fail("is an empty path");

  std::error_code ec;
  fs::file_status status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create it: " + ec.message());
    status = fs::status(dir, ec);
  }
  if (!fs::is_directory(status)) fail("is " + kind_of(status.type()) + ", not a directory");

  // Creating, writing and removing a file is the only test that finds every reason a save would fail there:
  // a read-only mount, permissions (access() says yes to root), an ACL, a quota or a disk already full.
  const fs::path probe = dir / probe_name();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail(std::string("cannot create a file in it: ") + std::strerror(errno));
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  const bool removed = ::unlink(probe.c_str()) == 0;
  if (!wrote) fail(std::string("cannot write a file in it: ") + std::strerror(write_errno));
  if (!removed) fail("cannot remove the file " + probe.string() + " it created: " + std::strerror(errno));

  if (bytes_needed > 0) {
    struct statvfs fs_info {};
    if (::statvfs(dir.c_str(), &fs_info) != 0) fail(std::string("statvfs: ") + std::strerror(errno));
    const uint64_t available = static_cast<uint64_t>(fs_info.f_bavail) * static_cast<uint64_t>(fs_info.f_frsize);
    if (available < bytes_needed) {
      fail("its file system has " + bytes_text(available) + " available, but " +
           (needed_for.empty() ? std::string("the run") : needed_for) + " needs about " + bytes_text(bytes_needed));
    }
  }
}

}  // namespace zero3

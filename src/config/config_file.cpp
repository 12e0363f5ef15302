#include "config/config_file.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "zero3/error.hpp"

namespace zero3::config_detail {

std::string bytes_text(uint64_t bytes) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  std::string s = std::to_string(bytes) + " bytes";
  if (bytes < kMiB) return s;
  s += " (" + std::to_string(bytes / kMiB);
  if (bytes % kMiB != 0) s += "." + std::to_string(bytes % kMiB * 10 / kMiB);  // tenths, rounded down
  return s + " MiB)";
}

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { ::close(fd_); }
  int get() const { return fd_; }

 private:
  int fd_;
};

// `what`: "has N bytes, more than" or "goes on past".
std::string too_large(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return path + ": the config file " + what + " the cap of " + bytes_text(max_bytes) +
         " (a DeepSpeed config is a few KiB); to read a larger one raise the cap: `zero3 config check "
         "--max-config-bytes N` (load_config's max_bytes in a program)";
}

}  // namespace

std::string read_config_file(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer, and reading it never blocks (see below).
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (raw < 0) {
    if (errno == EISDIR) throw ConfigError(path + ": is a directory, expected a DeepSpeed JSON config file");
    throw ConfigError(path + ": cannot open the config file (" + std::string(std::strerror(errno)) + ")");
  }
  Fd fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw ConfigError(path + ": cannot read the config file (" + std::string(std::strerror(errno)) + ")");
  }
  if (S_ISDIR(st.st_mode)) throw ConfigError(path + ": is a directory, expected a DeepSpeed JSON config file");
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw ConfigError(
        too_large(path, "has " + bytes_text(static_cast<uint64_t>(st.st_size)) + ", more than", max_bytes));
  }

  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(kConfigReadSeconds);
  std::string text;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      // A regular file that grew since fstat, or an endless source such as /dev/zero.
      if (text.size() > max_bytes) throw ConfigError(too_large(path, "goes on past", max_bytes));
      continue;
    }
    if (n == 0) break;  // end of input (a FIFO that no writer holds open reads as empty)
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        throw ConfigError(path + ": no end of input after " + std::to_string(kConfigReadSeconds) + " s (" +
                          std::to_string(text.size()) +
                          " bytes read); a pipe or FIFO whose writer neither writes nor closes it? zero3 waits "
                          "at most " +
                          std::to_string(kConfigReadSeconds) + " s for a config that is not a regular file");
      }
      pollfd p{fd.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(left));
      continue;
    }
    if (errno == EISDIR) throw ConfigError(path + ": is a directory, expected a DeepSpeed JSON config file");
    throw ConfigError(path + ": cannot read the config file (" + std::string(std::strerror(errno)) + ")");
  }
  return text;
}

}  // namespace zero3::config_detail

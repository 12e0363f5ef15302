// check_runtime_paths(): the checks that need the machine the run starts on.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/config_value.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

void check_dir(const Config& c, const std::string& key, const std::string& dir) {
  const std::string shown = config_detail::shorten(dir, 300);
  auto fail = [&](const std::string& what) {
    throw ConfigError(config_detail::error_text(key, "\"" + shown + "\" " + what, c.source));
  };
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    fail(std::string("cannot be used (") + std::strerror(errno) +
         "), expected an existing writable directory (create it: mkdir -p " + shown + ")");
  }
  if (!S_ISDIR(st.st_mode)) fail("is not a directory, expected an existing writable directory");
  // access(2) can say yes where creating a file fails (read-only bind mounts, quotas); try it.
  std::string probe = dir + "/.zero3-write-probe-XXXXXX";
  std::vector<char> name(probe.begin(), probe.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  if (fd < 0) {
    fail(std::string("is not writable (") + std::strerror(errno) +
         "), expected a directory where this user can create the swap files");
  }
  ::close(fd);
  ::unlink(name.data());
}

}  // namespace

void check_runtime_paths(const Config& config) {
  const ZeroConfig& z = config.zero;
  if (z.offload_param.device == OffloadDevice::nvme) {
    check_dir(config, "zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path);
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme) {
    check_dir(config, "zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path);
  }
}

}  // namespace zero3

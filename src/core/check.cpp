#include "core/check.hpp"

#include <cstring>

namespace zero3::detail {

std::string describe_failure(const char* what, const std::string& detail, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string where = base ? base + 1 : file;
  std::string rank = log::rank() >= 0 ? "rank " + std::to_string(log::rank()) + ", " : "";
  return std::string(what) + " failed: " + detail + " (" + rank + where + ":" + std::to_string(line) + ")";
}

void throw_errno(const char* what, int err, const char* file, int line) {
  throw IoError(describe_failure(what, std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")",
                                 file, line));
}

}  // namespace zero3::detail

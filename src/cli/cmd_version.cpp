#include <cstdio>

#include "cli/commands.hpp"
#include "zero3/version.hpp"

namespace zero3::cli {

int run_version(const Args&) {
  std::printf("zero3 %s\n%s", version().c_str(), build_summary().c_str());
  return 0;
}

}  // namespace zero3::cli

#include "checkpoint/crash_point.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/env.hpp"

namespace zero3::ckpt {

void crash_point(const char* point, int rank) {
  static const std::string spec = env::test_crash_at();
  if (spec.empty()) return;
  const size_t at = spec.find('@');
  const std::string name = spec.substr(0, at);
  if (name != point) return;
  if (at != std::string::npos && spec.substr(at + 1) != std::to_string(rank)) return;
  std::fprintf(stderr, "[zero3 rank %d] ZERO3_TEST_CRASH_AT=%s: ending the process at checkpoint point '%s'\n", rank,
               spec.c_str(), point);
  std::fflush(stderr);
  ::_exit(kCrashExitStatus);
}

}  // namespace zero3::ckpt

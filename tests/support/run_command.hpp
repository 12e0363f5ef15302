// Runs a shell command for a test and returns its standard output (what the command line redirects aside), and
// its exit status as pclose() gives it.
#pragma once

#include <cstdio>
#include <string>

namespace zero3::testing {

inline std::string run_command(const std::string& cmd, int* status) {
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  *status = pclose(f);
  return out;
}

}  // namespace zero3::testing

// main() of the benchmark programs: an exception ends the program with one line naming it and the error, and exit
// status 1, instead of std::terminate's abort.
//
//   int bench_main(int argc, char** argv) { ... }
//   int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

namespace zero3::testing {

template <class Body>
int run_main(int argc, char** argv, Body&& body) {
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "benchmark";
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: failed with an exception that is not a std::exception\n", program.c_str());
  }
  return 1;
}

}  // namespace zero3::testing

// Version and build facts of the zero3 library that the program linked against.
#pragma once

#include <string>

#include "zero3/build_config.hpp"

namespace zero3 {

// "0.1.0"
std::string version();

// One line per backend: compiled in or not, and the library version it was built against.
std::string build_summary();

}  // namespace zero3

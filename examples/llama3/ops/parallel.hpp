// When the CPU drivers split a loop over OpenMP threads: below this many elements of work the fork and
// barrier cost more than the loop (tiny test shapes, one attention row of a short sequence).
#pragma once

#include <cstdint>

namespace llama3 {

inline constexpr int64_t kParallelMinWork = 1 << 15;

}  // namespace llama3

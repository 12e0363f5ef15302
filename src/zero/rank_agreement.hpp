// Checks that every rank holds the same values, and explains the difference when they do not: how the
// engine turns "the ranks diverged" from a hang into an error message.
//
// Values travel as fp32 integers below 2^24 (exact), because collectives carry f32/bf16/f16 only. A 64-bit
// hash becomes three 22-bit pieces (hash_to_floats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/comm_queue.hpp"
#include "zero3/comm.hpp"

namespace zero3::detail {

// Largest integer an f32 holds exactly (2^24).
inline constexpr int64_t kMaxExactFloatInt = int64_t{1} << 24;

std::vector<float> hash_to_floats(uint64_t hash);

// 64-bit FNV-1a over bytes, continuing from `h`.
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull);

// Collective: true when `values` (same length on every rank) are equal on every rank. One all-reduce.
bool ranks_agree(CommQueue& queue, Communicator& comm, const std::vector<float>& values, const std::string& what);

// Collective: every rank's `values` (lengths may differ; entries are integers in [0, 2^24)), indexed by rank.
std::vector<std::vector<int64_t>> gather_from_ranks(CommQueue& queue, Communicator& comm,
                                                    const std::vector<int64_t>& values, const std::string& what);

// "0, 2, 5" for a list of ranks.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace zero3::detail

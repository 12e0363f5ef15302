// Argument checks and descriptions shared by every communicator backend, so that all of them reject the
// same calls with the same words: "<backend> all_reduce(count=7, dtype=bf16, op=sum) on rank 2 of 4".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero3/comm.hpp"

namespace zero3::comm {

enum class CollectiveKind : uint8_t { all_gather_into = 1, reduce_scatter, all_reduce, broadcast, barrier, all_to_all };

// One collective call as the ranks compare it before any data moves (comm.hpp, "Agreement").
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  uint64_t count = 0;
  DType dtype = DType::f32;
  int op = -1;    // the ReduceOp, -1 for a call without one
  int root = -1;  // broadcast's root, -1 for a call without one
  friend bool operator==(const CollectiveCall&, const CollectiveCall&) = default;
};

const char* collective_name(CollectiveKind kind);

// "all_gather_into(count=7, dtype=bf16)", "all_reduce(count=2, dtype=f32, op=max)", "barrier()".
std::string describe_call(const CollectiveCall& call);

// The CollectiveMismatchError sentence: "<what>: the ranks called different collectives as call #<number> of
// this communicator: rank 0 called all_gather_into(count=726, dtype=f32); ranks 1, 2 called ...". `by_rank`
// holds every rank's call.
std::string mismatch_message(const std::string& what, uint64_t number, const std::vector<CollectiveCall>& by_rank);

// "all_gather_into(count=7, dtype=bf16) on rank 2 of 4"; op and root only when given (op_name != nullptr,
// root >= 0).
std::string describe_collective(const char* collective, size_t count, DType dtype, int rank, int size,
                                const char* op_name = nullptr, int root = -1);

// Throws InvalidArgument naming the collective when a buffer is null for a non-zero count.
void require_buffer(const void* buf, const char* buffer_name, size_t count, const std::string& what);

// Throws InvalidArgument unless op is sum or avg (reduce_scatter allows no max).
void require_sum_or_avg(ReduceOp op, const std::string& what);

// Throws InvalidArgument unless 0 <= root < size.
void require_root(int root, int size, const std::string& what);

// Throws InvalidArgument when [a, a+a_bytes) and [b, b+b_bytes) overlap other than in the allowed in-place
// layout (b == allowed_alias).
void require_no_partial_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes, const void* allowed_alias,
                                const std::string& what);

}  // namespace zero3::comm

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
#include "zero3/device.hpp"

namespace zero3::detail {

// Largest integer an f32 holds exactly (2^24).
inline constexpr int64_t kMaxExactFloatInt = int64_t{1} << 24;

std::vector<float> hash_to_floats(uint64_t hash);

// 64-bit FNV-1a over bytes, continuing from `h`.
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull);

// A device copy of a host float array, for collectives on a communicator that works on device memory
// (nccl): made from the host values, copied back by copy_back(). With no device, or the cpu device, get() is
// the host array itself. Copies are synchronous.
class DeviceMirror {
 public:
  DeviceMirror(Device* device, float* host, size_t count);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  float* get() const { return ptr_; }
  // The stream a collective on get() runs on: the device's compute stream (nullptr without a device).
  Stream stream() const { return device_ != nullptr ? device_->default_stream() : nullptr; }
  void copy_back();

 private:
  Device* device_;
  float* host_;
  size_t bytes_;
  float* ptr_;
};

// Collective: true when `values` (same length on every rank) are equal on every rank. One all-reduce.
// `device`: where the communicator's buffers must live (null: host memory).
bool ranks_agree(CommQueue& queue, Communicator& comm, const std::vector<float>& values, const std::string& what,
                 Device* device = nullptr);

// Collective: every rank's `values` (lengths may differ; entries are integers in [0, 2^24)), indexed by rank.
std::vector<std::vector<int64_t>> gather_from_ranks(CommQueue& queue, Communicator& comm,
                                                    const std::vector<int64_t>& values, const std::string& what,
                                                    Device* device = nullptr);

// "0, 2, 5" for a list of ranks.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace zero3::detail

// Page-locked (pinned) host memory: the staging memory of asynchronous host<->device copies (a copy from
// pageable memory is synchronous and goes through CUDA's own bounce buffer at a fraction of the bandwidth).
//
// One process-wide cache (a PinnedHostCache, pinned_host_cache.hpp): cudaHostAlloc takes milliseconds
// and maps pages into every context, so blocks are kept and reused by size class. The memory is allocated
// portable: any device may copy from it.
//
// This header has no CUDA types, so offload code in plain .cpp files can use it; it exists only in builds with
// CUDA (guard the include with ZERO3_HAVE_CUDA from zero3/build_config.hpp).
// Threads: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "zero3/device.hpp"

namespace zero3::detail {

struct PinnedHostCacheStats;

// At least 512-byte aligned; nullptr for 0 bytes. Throws CudaError when CUDA cannot pin more memory.
void* pinned_host_allocate(size_t bytes);
// `bytes` as passed to pinned_host_allocate. nullptr is a no-op.
void pinned_host_deallocate(void* ptr, size_t bytes) noexcept;
// Reused only after the work queued on `stream` so far (e.g. a copy out of the block) has finished.
void pinned_host_deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept;
PinnedHostCacheStats pinned_host_stats();
// Returns the cached blocks to CUDA.
void pinned_host_empty_cache();

// An owning pinned buffer.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(size_t bytes) : ptr_(pinned_host_allocate(bytes)), bytes_(bytes) {}
  ~PinnedHostBuffer() { pinned_host_deallocate(ptr_, bytes_); }
  PinnedHostBuffer(PinnedHostBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedHostBuffer& operator=(PinnedHostBuffer&& o) noexcept {
    if (this != &o) {
      pinned_host_deallocate(ptr_, bytes_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zero3::detail

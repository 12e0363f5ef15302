// Page-locked host memory for the cuda backend: cudaHostAlloc'd blocks kept in size-class free lists and handed
// out again (cudaHostAlloc takes milliseconds and maps pages into every context, and cudaFreeHost synchronizes
// the device), so staging that frees and allocates the same sizes every step calls neither once the first step
// has warmed the cache. Device memory is not here: it comes from CUDA's stream-ordered pool (device_pool.hpp).
//
// Size classes: requests up to 1 MiB round up to 512 B, then to a quarter of their power of two (at most
// 25% over); larger requests round up to a multiple of 2 MiB. A block serves only requests of its own class,
// so the statistics stay exact and a step with fixed shapes reuses blocks one for one.
//
// Stream-ordered frees: deallocate_after(ptr, bytes, stream) records an event on `stream`; the block goes
// back to its free list only once that event has completed (the host writes into host memory, so it must
// know that the copies queued from it have run). Plain deallocate() is for memory that no queued work uses.
//
// When cudaHostAlloc fails the cache waits for the pending frees (one of them may be a block of the class
// asked for), then returns every cached block to CUDA and tries once more; a second failure is a CudaError
// naming the size and what zero3 holds.
//
// The memory is allocated portable (usable with every device); CUDA calls run under whichever device the
// caller has made current, so a process-wide cache creates no context of its own.
// Threads: every member may be called from any thread; a mutex protects the lists. Statistics are exact
// at any moment.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace zero3::detail {

struct PinnedHostCacheStats {
  int64_t bytes_in_use = 0;  // requested bytes of live allocations
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;  // bytes obtained from cudaHostAlloc and not yet returned
  int64_t peak_bytes_reserved = 0;
  int64_t bytes_cached = 0;   // of bytes_reserved: free blocks, ready for reuse
  int64_t bytes_pending = 0;  // of bytes_reserved: freed, waiting for their stream to pass an event
  int64_t allocations = 0;    // allocate() calls that returned memory
  int64_t cache_hits = 0;     // of which were served from a free list
  int64_t host_allocs = 0;    // cudaHostAlloc calls that succeeded
  int64_t host_frees = 0;     // cudaFreeHost calls
};

class PinnedHostCache {
 public:
  // `device` only names the cache in messages.
  explicit PinnedHostCache(int device);
  // Returns every cached block to CUDA; live blocks are logged (a leak in the caller) and left alone.
  ~PinnedHostCache();
  PinnedHostCache(const PinnedHostCache&) = delete;
  PinnedHostCache& operator=(const PinnedHostCache&) = delete;

  // The class a request of `bytes` is served from (bytes > 0).
  static size_t size_class(size_t bytes);

  // At least 512-byte aligned; nullptr for 0 bytes. Throws CudaError.
  void* allocate(size_t bytes);
  // `bytes` as passed to allocate(). Unknown pointers are logged and ignored (this runs in destructors).
  void deallocate(void* ptr, size_t bytes) noexcept;
  // Like deallocate, but the block is reused only after the work queued on `stream` so far has finished.
  void deallocate_after(void* ptr, size_t bytes, cudaStream_t stream) noexcept;

  // Returns every free block to CUDA (cudaFreeHost); waits for pending blocks' events first.
  void empty_cache();

  PinnedHostCacheStats stats();

 private:
  struct Live {
    size_t klass;
    size_t requested;
  };
  struct Pending {
    void* ptr;
    size_t klass;
    cudaEvent_t event;
  };

  // With mu_ held.
  bool take_live_locked(void* ptr, size_t bytes, size_t* klass);
  void* take_free_locked(size_t klass);  // a cached block of `klass`, or nullptr
  void* alloc_locked(size_t klass, size_t bytes);
  void collect_pending_locked(bool wait);
  void release_cached_locked();
  cudaEvent_t event_locked();
  std::string where() const;

  const int device_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // class -> blocks
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> events_;  // idle events for stream-ordered frees
  std::unordered_map<void*, Live> live_;
  PinnedHostCacheStats stats_;
};

}  // namespace zero3::detail

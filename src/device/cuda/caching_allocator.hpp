// Memory for the cuda backend: cudaMalloc'd device blocks (or cudaHostAlloc'd pinned host blocks, for
// staging) kept in size-class free lists and handed out again, so a training step that frees and allocates the same
// sizes every iteration calls neither cudaMalloc nor cudaFree once the first step has warmed the cache (cudaFree
// synchronizes the whole device, which would serialize every stream).
//
// Size classes: requests up to 1 MiB round up to 512 B, then to a quarter of their power of two (at most
// 25% over); larger requests round up to a multiple of 2 MiB (cudaMalloc's own granularity). A block serves
// only requests of its own class, so the statistics stay exact and a step with fixed shapes reuses blocks
// one for one.
//
// Stream-ordered frees: deallocate_after(ptr, bytes, stream) records an event on `stream`; the block goes
// back to its free list only once that event has completed, so kernels still queued on the stream never
// see the memory handed to someone else. Plain deallocate() is for memory that no queued work uses.
//
// When cudaMalloc fails the allocator waits for the pending frees (one of them may be a block of the class
// asked for), then returns every cached block to CUDA and tries once more; a second failure is a CudaError
// naming the size, the device and what zero3 holds on it.
//
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

enum class MemoryKind { device, pinned_host };

struct CachingAllocatorStats {
  int64_t bytes_in_use = 0;  // requested bytes of live allocations
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;  // bytes obtained from cudaMalloc and not yet returned
  int64_t peak_bytes_reserved = 0;
  int64_t bytes_cached = 0;    // of bytes_reserved: free blocks, ready for reuse
  int64_t bytes_pending = 0;   // of bytes_reserved: freed, waiting for their stream to pass an event
  int64_t allocations = 0;     // allocate() calls that returned memory
  int64_t cache_hits = 0;      // of which were served from a free list
  int64_t device_mallocs = 0;  // cudaMalloc (cudaHostAlloc) calls that succeeded
  int64_t device_frees = 0;    // cudaFree (cudaFreeHost) calls
};

class CachingAllocator {
 public:
  // `device`: the CUDA device the memory belongs to, made current for every CUDA call. Pinned host memory is
  // allocated portable, usable with every device: `device` only names it in messages, and its calls run under
  // whichever device the caller has made current (so a process-wide pool creates no context of its own).
  explicit CachingAllocator(int device, MemoryKind kind = MemoryKind::device);
  // Returns every cached block to CUDA; live blocks are logged (a leak in the caller) and left alone.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The class a request of `bytes` is served from (bytes > 0).
  static size_t size_class(size_t bytes);

  // At least 256-byte aligned (cudaMalloc's alignment); nullptr for 0 bytes. Throws CudaError.
  void* allocate(size_t bytes);
  // `bytes` as passed to allocate(). Unknown pointers are logged and ignored (this runs in destructors).
  void deallocate(void* ptr, size_t bytes) noexcept;
  // Like deallocate, but the block is reused only after the work queued on `stream` so far has finished.
  void deallocate_after(void* ptr, size_t bytes, cudaStream_t stream) noexcept;

  // Returns every free block to CUDA (cudaFree); waits for pending blocks' events first.
  void empty_cache();

  CachingAllocatorStats stats();
  int device() const { return device_; }
  MemoryKind kind() const { return kind_; }

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
  void* malloc_locked(size_t klass, size_t bytes);
  void collect_pending_locked(bool wait);
  void release_cached_locked();
  cudaEvent_t event_locked();
  cudaError_t raw_alloc(void** ptr, size_t bytes);
  void raw_free(void* ptr);
  std::string where() const;
  // The device to make current around CUDA calls; -1 (leave it) for pinned host memory.
  int guard_device() const { return kind_ == MemoryKind::device ? device_ : -1; }

  const int device_;
  const MemoryKind kind_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // class -> blocks
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> events_;  // idle events for stream-ordered frees
  std::unordered_map<void*, Live> live_;
  CachingAllocatorStats stats_;
};

}  // namespace zero3::detail

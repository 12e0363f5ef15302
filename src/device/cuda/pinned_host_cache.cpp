#include "device/cuda/pinned_host_cache.hpp"

#include <bit>

#include "device/cuda/cuda_check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kMinBlock = 512;
constexpr size_t kLargeGranule = size_t{2} << 20;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

size_t PinnedHostCache::size_class(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes > kSmallLimit) return round_up(bytes, kLargeGranule);
  size_t p = std::bit_floor(bytes);
  return round_up(bytes, p / 4);
}

PinnedHostCache::PinnedHostCache(int device) : device_(device) {}

std::string PinnedHostCache::where() const { return log::concat("cuda:", device_, " pinned host memory"); }

PinnedHostCache::~PinnedHostCache() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.empty()) {
    log::warn(where(), ": ", live_.size(), " allocations (", stats_.bytes_in_use,
              " bytes) still live when the device was destroyed; they are not freed");
  }
  // At process exit the CUDA runtime may already be gone; every call below then fails harmlessly.
  for (Pending& p : pending_) {
    cudaEventSynchronize(p.event);
    cudaEventDestroy(p.event);
    cudaFreeHost(p.ptr);
  }
  pending_.clear();
  for (auto& [klass, blocks] : free_) {
    for (void* b : blocks) cudaFreeHost(b);
  }
  free_.clear();
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  cudaGetLastError();
}

void* PinnedHostCache::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t klass = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  collect_pending_locked(false);
  void* ptr = take_free_locked(klass);
  if (ptr == nullptr) ptr = alloc_locked(klass, bytes);
  live_.emplace(ptr, Live{klass, bytes});
  ++stats_.allocations;
  stats_.bytes_in_use += static_cast<int64_t>(bytes);
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return ptr;
}

void* PinnedHostCache::alloc_locked(size_t klass, size_t bytes) {
  void* ptr = nullptr;
  cudaError_t e = cudaHostAlloc(&ptr, klass, cudaHostAllocPortable);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    // Wait for the pending frees: a block of this class may be among them (the host runs ahead of the streams,
    // so a block freed a moment ago is often still pending). Failing that, give the cache back to CUDA (blocks
    // of other classes may make room) and try once more.
    collect_pending_locked(true);
    if (void* freed = take_free_locked(klass)) return freed;
    release_cached_locked();
    e = cudaHostAlloc(&ptr, klass, cudaHostAllocPortable);
  }
  if (e != cudaSuccess) {
    std::string what = cuda_error_detail(e);
    throw CudaError(log::concat(where(), ": cannot allocate ", bytes, " bytes (block of ", klass, " bytes): ", what,
                                "; zero3 has ", stats_.bytes_in_use, " bytes in use and ", stats_.bytes_reserved,
                                " reserved here"));
  }
  ++stats_.host_allocs;
  stats_.bytes_reserved += static_cast<int64_t>(klass);
  if (stats_.bytes_reserved > stats_.peak_bytes_reserved) stats_.peak_bytes_reserved = stats_.bytes_reserved;
  return ptr;
}

void* PinnedHostCache::take_free_locked(size_t klass) {
  auto it = free_.find(klass);
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  stats_.bytes_cached -= static_cast<int64_t>(klass);
  ++stats_.cache_hits;
  return ptr;
}

bool PinnedHostCache::take_live_locked(void* ptr, size_t bytes, size_t* klass) {
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    log::error(where(), ": deallocate of ", ptr, " (", bytes,
               " bytes), which this device did not allocate or already freed; ignored");
    return false;
  }
  if (it->second.requested != bytes) {
    log::error(where(), ": deallocate of ", ptr, " with ", bytes, " bytes, but it was allocated with ",
               it->second.requested, " bytes; counting the allocated size");
  }
  *klass = it->second.klass;
  stats_.bytes_in_use -= static_cast<int64_t>(it->second.requested);
  live_.erase(it);
  return true;
}

void PinnedHostCache::deallocate(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  size_t klass = 0;
  if (!take_live_locked(ptr, bytes, &klass)) return;
  free_[klass].push_back(ptr);
  stats_.bytes_cached += static_cast<int64_t>(klass);
}

void PinnedHostCache::deallocate_after(void* ptr, size_t bytes, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  size_t klass = 0;
  if (!take_live_locked(ptr, bytes, &klass)) return;
  cudaEvent_t event = nullptr;
  try {
    // Under the caller's current device: `stream` may be the legacy default stream, which means that device's.
    event = event_locked();
    ZERO3_CUDA_CHECK(cudaEventRecord(event, stream));
  } catch (const std::exception& e) {
    // Without an event the only safe order is to wait for the stream here.
    log::error(where(), ": cannot record the release of a block on its stream (", e.what(),
               "); waiting for the stream instead");
    if (event != nullptr) events_.push_back(event);
    if (cudaStreamSynchronize(stream) != cudaSuccess) cudaDeviceSynchronize();
    cudaGetLastError();
    free_[klass].push_back(ptr);
    stats_.bytes_cached += static_cast<int64_t>(klass);
    return;
  }
  pending_.push_back(Pending{ptr, klass, event});
  stats_.bytes_pending += static_cast<int64_t>(klass);
}

cudaEvent_t PinnedHostCache::event_locked() {
  if (!events_.empty()) {
    cudaEvent_t e = events_.back();
    events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void PinnedHostCache::collect_pending_locked(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    cudaError_t e = wait ? cudaEventSynchronize(p.event) : cudaEventQuery(p.event);
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is an answer, not an error to report later
      pending_[kept++] = p;
      continue;
    }
    // Done, or the stream failed (a sticky error that every later CUDA call reports): either way no more
    // work will touch the block.
    if (e != cudaSuccess) cudaGetLastError();
    events_.push_back(p.event);
    free_[p.klass].push_back(p.ptr);
    stats_.bytes_pending -= static_cast<int64_t>(p.klass);
    stats_.bytes_cached += static_cast<int64_t>(p.klass);
  }
  pending_.resize(kept);
}

void PinnedHostCache::release_cached_locked() {
  for (auto& [klass, blocks] : free_) {
    for (void* b : blocks) {
      cudaFreeHost(b);
      ++stats_.host_frees;
      stats_.bytes_reserved -= static_cast<int64_t>(klass);
      stats_.bytes_cached -= static_cast<int64_t>(klass);
    }
    blocks.clear();
  }
  cudaGetLastError();
}

void PinnedHostCache::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  collect_pending_locked(true);
  release_cached_locked();
}

PinnedHostCacheStats PinnedHostCache::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  collect_pending_locked(false);
  return stats_;
}

}  // namespace zero3::detail

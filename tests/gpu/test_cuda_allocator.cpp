// The cuda device's memory: CUDA's stream-ordered pool for device memory (same-stream reuse without any host
// wait, no device allocation once a step loop has grown the pool, frees on another stream ordered by that
// stream, an out-of-memory path that retries without synchronizing the device and then names the request and
// the pool's state) and the pinned host cache (size classes, reuse, exact statistics, stream-ordered frees).
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda/cuda_device.hpp"
#include "device/cuda/cuda_stream.hpp"
#include "device/cuda/device_pool.hpp"
#include "device/cuda/pinned_host.hpp"
#include "device/cuda/pinned_host_cache.hpp"

namespace zero3::detail {
namespace {

void hold_stream(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
}

// Holds `stream` with a host function until release() (or the destructor, which waits for the stream, so the
// host function is done with the flag before it goes).
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) : stream_(stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, hold_stream, &release_), cudaSuccess);
  }
  ~StreamHold() {
    release();
    cudaStreamSynchronize(stream_);
  }
  void release() { release_ = true; }

 private:
  cudaStream_t stream_;
  std::atomic<bool> release_{false};
};

// ---- Device memory: the stream-ordered pool ----

TEST(CudaDevicePool, SameStreamReuseNeedsNoWait) {
  // The compute stream is held: nothing queued there runs. A block freed on it serves the next allocation on it
  // at once (stream order makes that safe), so the pool does not grow; the old caching allocator had to wait for
  // the stream, or map new memory. The block is large enough that the pool cannot hold two.
  CudaStream compute(0);
  DevicePool pool(0, compute.get());
  StreamHold hold(compute.get());
  const size_t bytes = size_t{64} << 20;
  void* p = pool.allocate(bytes);
  ASSERT_EQ(cudaMemsetAsync(p, 1, bytes, compute.get()), cudaSuccess);
  const DevicePoolStats before = pool.stats();
  ASSERT_LT(before.bytes_reserved, static_cast<int64_t>(2 * bytes)) << "the pool mapped room for two blocks";
  pool.deallocate_after(p, bytes, compute.get());
  void* q = pool.allocate(bytes);
  const DevicePoolStats after = pool.stats();
  EXPECT_EQ(after.device_allocations, before.device_allocations)
      << "the pool grew although a block freed on the same stream was there (" << (q == p ? "same" : "other")
      << " address)";
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_EQ(after.bytes_in_use, static_cast<int64_t>(bytes));
  hold.release();
  pool.deallocate_after(q, bytes, compute.get());
  compute.synchronize();
  EXPECT_EQ(pool.stats().bytes_in_use, 0);
}

// A training step's pattern: persistent buffers, then per unit a gathered buffer and a gradient buffer that
// live for part of the step, all freed on the compute stream, which is held for the whole step (the host runs
// ahead of it, as it does on a GPU). After the first step the pool maps no more device memory.
TEST(CudaDevicePool, NoDeviceAllocationInSteadyState) {
  CudaStream compute(0);
  auto device = make_device("cuda", compute.stream());
  auto& cuda = dynamic_cast<CudaDevice&>(*device);
  const size_t units[] = {7 * 1001 * 4, 1000003 * 2, 4096 * 4096 * 2 + 6, 33 * 2, 1000003 * 2};
  std::vector<void*> persistent;
  for (size_t u : units) persistent.push_back(device->allocate(u / 4 + 1));
  int64_t grown_after_first = -1;
  int64_t reserved_after_first = -1;
  for (int step = 0; step < 6; ++step) {
    StreamHold hold(compute.get());
    std::vector<std::pair<void*, size_t>> live;
    for (size_t u : units) {  // forward: gather, use, release (the last two stay until backward)
      void* full = device->allocate(u);
      device->fill_zero(full, u, compute.stream());
      live.emplace_back(full, u);
      if (live.size() > 2) {
        device->deallocate_after(live.front().first, live.front().second, compute.stream());
        live.erase(live.begin());
      }
    }
    for (auto it = std::rbegin(units); it != std::rend(units); ++it) {  // backward: gradients
      void* grad = device->allocate(*it);
      device->fill_zero(grad, *it, compute.stream());
      device->deallocate_after(grad, *it, compute.stream());
    }
    for (auto& [ptr, bytes] : live) device->deallocate_after(ptr, bytes, compute.stream());
    hold.release();
    const DevicePoolStats s = cuda.pool().stats();
    if (step == 0) {
      grown_after_first = s.device_allocations;
      reserved_after_first = s.peak_bytes_reserved;
    } else {
      EXPECT_EQ(s.device_allocations, grown_after_first) << "the pool mapped device memory in step " << step;
      EXPECT_EQ(s.peak_bytes_reserved, reserved_after_first) << "step " << step;
    }
  }
  compute.synchronize();
  for (size_t i = 0; i < std::size(units); ++i) device->deallocate(persistent[i], units[i] / 4 + 1);
  EXPECT_EQ(device->bytes_in_use(), 0);
  EXPECT_EQ(cuda.pool().stats().out_of_memory_retries, 0);
}

TEST(CudaDevicePool, AFreeOnAnotherStreamIsOrderedByThatStream) {
  // A block written on a side stream (held) and freed there; the next allocation on the compute stream may get
  // the same memory only once the side stream's write has run, so the compute stream's write lands last.
  CudaStream compute(0), side(0);
  DevicePool pool(0, compute.get());
  const size_t bytes = 8 << 20;
  void* p = pool.allocate(bytes);
  CudaEvent allocated(0);
  allocated.record(compute.get());
  allocated.make_wait(side.get());
  StreamHold hold(side.get());
  ASSERT_EQ(cudaMemsetAsync(p, 1, bytes, side.get()), cudaSuccess);
  pool.deallocate_after(p, bytes, side.get());
  EXPECT_EQ(pool.stats().frees_on_other_streams, 1);
  void* q = pool.allocate(bytes);
  ASSERT_EQ(cudaMemsetAsync(q, 2, bytes, compute.get()), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  hold.release();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> host(bytes);
  ASSERT_EQ(cudaMemcpy(host.data(), q, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i : {size_t{0}, bytes / 2, bytes - 1})
    EXPECT_EQ(host[i], 2) << "byte " << i << (q == p ? " (same block)" : "");
  pool.deallocate(q, bytes);
}

TEST(CudaDevicePool, OutOfMemoryRetriesWithoutADeviceSyncThenNamesThePool) {
  auto device = make_device("cuda");
  auto& cuda = dynamic_cast<CudaDevice&>(*device);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  void* small = device->allocate(1 << 20);
  device->deallocate(small, 1 << 20);
  // A stream of nobody's, held: a device-wide synchronization in the retry would wait for it forever (a
  // watchdog releases it after 20 s and the test fails).
  CudaStream unrelated(0);
  StreamHold hold(unrelated.get());
  std::atomic<bool> done{false}, rescued{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done) {
      rescued = true;
      hold.release();
    }
  });
  try {
    device->allocate(total_bytes * 2);
    ADD_FAILURE() << "allocating twice the device's memory succeeded";
  } catch (const CudaError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cuda:0: cannot allocate " + std::to_string(total_bytes * 2) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("high-water"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes free"), std::string::npos) << m;
  }
  done = true;
  watchdog.join();
  EXPECT_FALSE(rescued) << "the out-of-memory path waited for a stream it has nothing to do with";
  hold.release();
  const DevicePoolStats s = cuda.pool().stats();
  EXPECT_EQ(s.out_of_memory_retries, 1);
  EXPECT_GE(s.trims, 1);
  void* p = device->allocate(1 << 20);
  EXPECT_NE(p, nullptr);
  device->fill_zero(p, 1 << 20);
  device->deallocate(p, 1 << 20);
  EXPECT_EQ(device->bytes_in_use(), 0);
}

TEST(CudaDevicePool, PeakFollowsTheHighestPoint) {
  auto device = make_device("cuda");
  EXPECT_EQ(device->bytes_in_use(), 0);
  void* a = device->allocate(1000);
  void* b = device->allocate(3000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  device->deallocate(a, 1000);
  void* c = device->allocate(500);
  EXPECT_EQ(device->bytes_in_use(), 3500);
  EXPECT_EQ(device->peak_bytes_in_use(), 4000);
  device->deallocate(b, 3000);
  device->deallocate(c, 500);
  EXPECT_EQ(device->bytes_in_use(), 0);
  EXPECT_EQ(device->peak_bytes_in_use(), 4000);
  EXPECT_EQ(device->allocate(0), nullptr);
  device->deallocate(nullptr, 0);
}

TEST(CudaDevicePool, UnknownPointerIsLoggedNotFatal) {
  CudaStream compute(0);
  DevicePool pool(0, compute.get());
  int host = 0;
  pool.deallocate(&host, 4);  // logged and ignored
  void* p = pool.allocate(100);
  pool.deallocate(p, 100);
  pool.deallocate(p, 100);  // double free: logged and ignored
  compute.synchronize();
  EXPECT_EQ(pool.stats().bytes_in_use, 0);
  EXPECT_EQ(pool.stats().allocations, 1);
}

// ---- Pinned host memory ----

TEST(CudaPinnedHostCache, SizeClasses) {
  EXPECT_EQ(PinnedHostCache::size_class(1), 512u);
  EXPECT_EQ(PinnedHostCache::size_class(512), 512u);
  EXPECT_EQ(PinnedHostCache::size_class(513), 640u);  // 512 + 512/4
  EXPECT_EQ(PinnedHostCache::size_class(1000), 1024u);
  EXPECT_EQ(PinnedHostCache::size_class(1025), 1280u);
  EXPECT_EQ(PinnedHostCache::size_class(1 << 20), size_t{1} << 20);
  EXPECT_EQ(PinnedHostCache::size_class((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(PinnedHostCache::size_class((size_t{5} << 20) + 3), size_t{6} << 20);
  for (size_t b = 1; b < (size_t{8} << 20); b = b * 3 / 2 + 1) {
    size_t k = PinnedHostCache::size_class(b);
    EXPECT_GE(k, b);
    EXPECT_EQ(PinnedHostCache::size_class(k), k) << "a class is its own class";
    if (b > 512 && b <= (1u << 20)) {
      EXPECT_LE(k, b + b / 4 + 1) << b;
    }
  }
}

TEST(CudaPinnedHostCache, ReusesFreedBlocksAndCountsExactly) {
  PinnedHostCache a(0);
  const size_t sizes[] = {1, 4097, 1000003 * 4, 3 * (size_t{1} << 20) + 17};
  std::vector<void*> first;
  int64_t expected = 0;
  for (size_t s : sizes) {
    first.push_back(a.allocate(s));
    expected += static_cast<int64_t>(s);
  }
  PinnedHostCacheStats s1 = a.stats();
  EXPECT_EQ(s1.bytes_in_use, expected);
  EXPECT_EQ(s1.host_allocs, 4);
  for (size_t i = 0; i < 4; ++i) a.deallocate(first[i], sizes[i]);
  PinnedHostCacheStats s2 = a.stats();
  EXPECT_EQ(s2.bytes_in_use, 0);
  EXPECT_EQ(s2.peak_bytes_in_use, expected);
  EXPECT_EQ(s2.bytes_cached, s2.bytes_reserved);
  std::set<void*> again;
  for (int i = 3; i >= 0; --i) again.insert(a.allocate(sizes[i]));
  EXPECT_EQ(again, std::set<void*>(first.begin(), first.end()));
  EXPECT_EQ(a.stats().host_allocs, 4);
  EXPECT_EQ(a.stats().cache_hits, 4);
  for (size_t i = 0; i < 4; ++i) a.deallocate(first[i], sizes[i]);
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_reserved, 0);
  EXPECT_EQ(a.stats().host_frees, 4);
}

TEST(CudaPinnedHostCache, StreamOrderedFreeWaitsForItsStream) {
  // Host memory: the host may write it once reused, so a block comes back only after its stream has passed.
  PinnedHostCache a(0);
  CudaStream stream(0);
  void* p = a.allocate(1 << 16);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1 << 16), cudaSuccess);
  StreamHold hold(stream.get());
  ASSERT_EQ(cudaMemcpyAsync(d, p, 1 << 16, cudaMemcpyHostToDevice, stream.get()), cudaSuccess);
  a.deallocate_after(p, 1 << 16, stream.get());
  EXPECT_EQ(a.stats().bytes_pending, 1 << 16);
  void* q = a.allocate(1 << 16);
  EXPECT_NE(q, p) << "a block was handed out while its stream still had work on it";
  hold.release();
  stream.synchronize();
  void* r = a.allocate(1 << 16);
  EXPECT_EQ(r, p) << "the block came back after its stream passed the release";
  a.deallocate(q, 1 << 16);
  a.deallocate(r, 1 << 16);
  EXPECT_EQ(a.stats().bytes_pending, 0);
  cudaFree(d);
}

TEST(CudaPinnedHostCache, ProcessCacheIsPinnedReusedAndCounted) {
  PinnedHostCacheStats before = pinned_host_stats();
  void* p = pinned_host_allocate(3 << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "not page-locked host memory";
  PinnedHostCacheStats during = pinned_host_stats();
  EXPECT_EQ(during.bytes_in_use - before.bytes_in_use, 3 << 20);
  pinned_host_deallocate(p, 3 << 20);
  {
    PinnedHostBuffer b(3 << 20);
    EXPECT_EQ(b.data(), p) << "the cached block was reused";
  }
  PinnedHostCacheStats after = pinned_host_stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.host_allocs, during.host_allocs);

  // Asynchronous copies from pinned memory round-trip through the device.
  auto device = make_device("cuda");
  CudaStream stream(0);
  PinnedHostBuffer src(1000003 * 4), back(1000003 * 4);
  for (int i = 0; i < 1000003; ++i) src.as<int>()[i] = i * 7 + 1;
  void* d = device->allocate(1000003 * 4);
  auto allocated = device->make_event();
  allocated->record(device->default_stream());
  allocated->wait_on(stream.stream());
  device->copy(d, src.data(), 1000003 * 4, stream.stream());
  device->copy(back.data(), d, 1000003 * 4, stream.stream());
  stream.synchronize();
  EXPECT_EQ(std::memcmp(src.data(), back.data(), 1000003 * 4), 0);
  device->deallocate(d, 1000003 * 4);
}

}  // namespace
}  // namespace zero3::detail

#else

TEST(CudaAllocator, NotInThisBuild) {}

#endif

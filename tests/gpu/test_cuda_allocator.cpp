// The cuda device's caching allocator and pinned host pool: size classes, reuse, exact statistics and peak,
// no cudaMalloc once a step loop has warmed the cache, stream-ordered frees that hold a block back until its
// stream has passed, and a clear error (and a usable device afterwards) when memory runs out.
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda/caching_allocator.hpp"
#include "device/cuda/cuda_device.hpp"
#include "device/cuda/cuda_stream.hpp"
#include "device/cuda/pinned_host.hpp"

namespace zero3::detail {
namespace {

TEST(CudaAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingAllocator::size_class(512), 512u);
  EXPECT_EQ(CachingAllocator::size_class(513), 640u);  // 512 + 512/4
  EXPECT_EQ(CachingAllocator::size_class(1000), 1024u);
  EXPECT_EQ(CachingAllocator::size_class(1025), 1280u);
  EXPECT_EQ(CachingAllocator::size_class(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::size_class((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::size_class((size_t{5} << 20) + 3), size_t{6} << 20);
  for (size_t b = 1; b < (size_t{8} << 20); b = b * 3 / 2 + 1) {
    size_t k = CachingAllocator::size_class(b);
    EXPECT_GE(k, b);
    EXPECT_EQ(CachingAllocator::size_class(k), k) << "a class is its own class";
    if (b > 512 && b <= (1u << 20)) {
      EXPECT_LE(k, b + b / 4 + 1) << b;
    }
  }
}

TEST(CudaAllocator, ReusesFreedBlocksAndCountsExactly) {
  CachingAllocator a(0);
  const size_t sizes[] = {1, 4097, 1000003 * 4, 3 * (size_t{1} << 20) + 17};
  std::vector<void*> first;
  int64_t expected = 0;
  for (size_t s : sizes) {
    first.push_back(a.allocate(s));
    expected += static_cast<int64_t>(s);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first.back()) % 256, 0u);
  }
  CachingAllocatorStats s1 = a.stats();
  EXPECT_EQ(s1.bytes_in_use, expected);
  EXPECT_EQ(s1.peak_bytes_in_use, expected);
  EXPECT_EQ(s1.device_mallocs, 4);
  EXPECT_EQ(s1.cache_hits, 0);
  for (size_t i = 0; i < 4; ++i) a.deallocate(first[i], sizes[i]);
  CachingAllocatorStats s2 = a.stats();
  EXPECT_EQ(s2.bytes_in_use, 0);
  EXPECT_EQ(s2.peak_bytes_in_use, expected);
  EXPECT_EQ(s2.bytes_cached, s2.bytes_reserved);
  EXPECT_EQ(s2.device_frees, 0);
  // Same sizes again (in another order): the same blocks, no new cudaMalloc.
  std::set<void*> again;
  for (int i = 3; i >= 0; --i) again.insert(a.allocate(sizes[i]));
  EXPECT_EQ(again, std::set<void*>(first.begin(), first.end()));
  CachingAllocatorStats s3 = a.stats();
  EXPECT_EQ(s3.device_mallocs, 4);
  EXPECT_EQ(s3.cache_hits, 4);
  EXPECT_EQ(s3.bytes_cached, 0);
  // A size in the same class as a cached block reuses it; the statistics count the requested bytes.
  void* p = *again.begin();
  size_t size_of_p = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (first[i] == p) size_of_p = sizes[i];
  }
  a.deallocate(p, size_of_p);
  void* q = a.allocate(CachingAllocator::size_class(size_of_p));
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().bytes_in_use,
            expected - static_cast<int64_t>(size_of_p) + static_cast<int64_t>(CachingAllocator::size_class(size_of_p)));
  a.deallocate(q, CachingAllocator::size_class(size_of_p));
  for (size_t i = 0; i < 4; ++i) {
    if (first[i] != p) a.deallocate(first[i], sizes[i]);
  }
  EXPECT_EQ(a.stats().bytes_in_use, 0);
  a.empty_cache();
  CachingAllocatorStats s4 = a.stats();
  EXPECT_EQ(s4.bytes_reserved, 0);
  EXPECT_EQ(s4.device_frees, 4);
}

void hold_stream(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
}

// A training step's pattern: persistent buffers, then per unit a gathered buffer and a gradient buffer that
// live for part of the step, freed partly on a stream. After the first step, no cudaMalloc and no cudaFree.
// The stream is held until the end of each step, so no stream-ordered free completes early in one step and
// late in another: every step needs exactly the blocks the first one did.
TEST(CudaAllocator, NoCudaMallocInSteadyState) {
  auto device = make_device("cuda");
  auto& cuda = dynamic_cast<CudaDevice&>(*device);
  CudaStream comm(0);
  const size_t units[] = {7 * 1001 * 4, 1000003 * 2, 4096 * 4096 * 2 + 6, 33 * 2, 1000003 * 2};
  std::vector<void*> persistent;
  for (size_t u : units) persistent.push_back(device->allocate(u / 4 + 1));
  int64_t mallocs_after_first = -1;
  int64_t peak_after_first = -1;
  for (int step = 0; step < 6; ++step) {
    std::atomic<bool> release{false};
    ASSERT_EQ(cudaLaunchHostFunc(comm.get(), hold_stream, &release), cudaSuccess);
    std::vector<std::pair<void*, size_t>> live;
    for (size_t u : units) {  // forward: gather, use, release (the last two stay until backward)
      void* full = device->allocate(u);
      device->fill_zero(full, u, comm.stream());
      live.emplace_back(full, u);
      if (live.size() > 2) {
        cuda.deallocate_after(live.front().first, live.front().second, comm.stream());
        live.erase(live.begin());
      }
    }
    for (auto it = std::rbegin(units); it != std::rend(units); ++it) {  // backward: gradients
      void* grad = device->allocate(*it);
      device->fill_zero(grad, *it, comm.stream());
      cuda.deallocate_after(grad, *it, comm.stream());
    }
    for (auto& [ptr, bytes] : live) cuda.deallocate_after(ptr, bytes, comm.stream());
    EXPECT_GT(cuda.allocator().stats().bytes_pending, 0);
    release = true;
    comm.synchronize();  // the step boundary (the optimizer reads the reduced gradients)
    CachingAllocatorStats s = cuda.allocator().stats();
    EXPECT_EQ(s.bytes_pending, 0) << "step " << step;
    if (step == 0) {
      mallocs_after_first = s.device_mallocs;
      peak_after_first = s.peak_bytes_reserved;
    } else {
      EXPECT_EQ(s.device_mallocs, mallocs_after_first) << "cudaMalloc in step " << step;
      EXPECT_EQ(s.device_frees, 0) << "cudaFree in step " << step;
      EXPECT_EQ(s.peak_bytes_reserved, peak_after_first) << "step " << step;
    }
  }
  for (size_t i = 0; i < std::size(units); ++i) device->deallocate(persistent[i], units[i] / 4 + 1);
  EXPECT_EQ(device->bytes_in_use(), 0);
}

TEST(CudaAllocator, PeakFollowsTheHighestPoint) {
  auto device = make_device("cuda");
  EXPECT_EQ(device->bytes_in_use(), 0);
  void* a = device->allocate(1000);
  void* b = device->allocate(3000);
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

TEST(CudaAllocator, StreamOrderedFreeWaitsForItsStream) {
  CachingAllocator a(0);
  CudaStream stream(0);
  std::atomic<bool> release{false};
  void* p = a.allocate(1 << 16);
  ASSERT_EQ(cudaLaunchHostFunc(stream.get(), hold_stream, &release), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 1, 1 << 16, stream.get()), cudaSuccess);  // queued behind the hold
  a.deallocate_after(p, 1 << 16, stream.get());
  EXPECT_EQ(a.stats().bytes_pending, 1 << 16);
  void* q = a.allocate(1 << 16);
  EXPECT_NE(q, p) << "a block was handed out while its stream still had work on it";
  EXPECT_EQ(a.stats().device_mallocs, 2);
  release = true;
  stream.synchronize();
  void* r = a.allocate(1 << 16);
  EXPECT_EQ(r, p) << "the block came back after its stream passed the release";
  a.deallocate(q, 1 << 16);
  a.deallocate(r, 1 << 16);
  EXPECT_EQ(a.stats().bytes_pending, 0);
}

TEST(CudaAllocator, OutOfMemoryIsAClearErrorAndTheDeviceStaysUsable) {
  auto device = make_device("cuda");
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  void* small = device->allocate(1 << 20);
  device->deallocate(small, 1 << 20);  // cached: the failing request first gives the cache back
  try {
    device->allocate(total_bytes * 2);
    FAIL() << "allocating twice the device's memory succeeded";
  } catch (const CudaError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cuda:0: cannot allocate " + std::to_string(total_bytes * 2) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
  }
  auto& cuda = dynamic_cast<CudaDevice&>(*device);
  EXPECT_EQ(cuda.allocator().stats().bytes_cached, 0) << "the cache was given back before failing";
  void* p = device->allocate(1 << 20);
  EXPECT_NE(p, nullptr);
  device->fill_zero(p, 1 << 20);
  device->deallocate(p, 1 << 20);
  EXPECT_EQ(device->bytes_in_use(), 0);
}

TEST(CudaAllocator, UnknownPointerIsLoggedNotFatal) {
  CachingAllocator a(0);
  int host = 0;
  a.deallocate(&host, 4);  // logged and ignored
  void* p = a.allocate(100);
  a.deallocate(p, 100);
  a.deallocate(p, 100);  // double free: logged and ignored, the block is cached once
  EXPECT_EQ(a.stats().bytes_cached, 512);
}

TEST(CudaPinnedHost, IsPinnedReusedAndCounted) {
  CachingAllocatorStats before = pinned_host_stats();
  void* p = pinned_host_allocate(3 << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "not page-locked host memory";
  CachingAllocatorStats during = pinned_host_stats();
  EXPECT_EQ(during.bytes_in_use - before.bytes_in_use, 3 << 20);
  pinned_host_deallocate(p, 3 << 20);
  {
    PinnedHostBuffer b(3 << 20);
    EXPECT_EQ(b.data(), p) << "the cached block was reused";
  }
  CachingAllocatorStats after = pinned_host_stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.device_mallocs, during.device_mallocs);

  // Asynchronous copies from pinned memory round-trip through the device.
  auto device = make_device("cuda");
  CudaStream stream(0);
  PinnedHostBuffer src(1000003 * 4), back(1000003 * 4);
  for (int i = 0; i < 1000003; ++i) src.as<int>()[i] = i * 7 + 1;
  void* d = device->allocate(1000003 * 4);
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

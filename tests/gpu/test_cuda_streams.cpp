// Streams and events of the cuda device through the public Device interface: work on one stream waits for
// another only through an event (no host synchronization), stream-ordered frees, the caller's compute stream
// (make_device("cuda", stream)), and page-locked host memory.
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/device_kernels.hpp"

namespace zero3 {
namespace {

void hold_stream(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
}

TEST(CudaStreams, EventOrdersOneStreamAfterAnother) {
  auto gpu = make_device("cuda");
  auto producer = gpu->make_stream();
  auto consumer = gpu->make_stream();
  EXPECT_NE(producer->get(), nullptr);
  EXPECT_NE(producer->get(), consumer->get());
  const int64_t n = 1000003;
  float* a = static_cast<float*>(gpu->allocate(n * 4));
  float* b = static_cast<float*>(gpu->allocate(n * 4));
  gpu->fill_zero(a, n * 4);
  gpu->fill_zero(b, n * 4);
  auto* host = static_cast<float*>(gpu->allocate_host(n * 4));

  // The producer is held by a host function; the consumer's copy is made to wait for the producer's fill
  // through the event only. While held, the consumer cannot have run; after release it sees the fill.
  std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(producer->get()), hold_stream, &release), cudaSuccess);
  detail::kernels_of(*gpu).init_fill(a, FillSpec::constant(2.5), 1, 1, 0, n, producer->get());
  auto filled = gpu->make_event();
  filled->record(producer->get());
  filled->wait_on(consumer->get());
  gpu->copy(b, a, n * 4, consumer->get());
  gpu->copy(host, b, n * 4, consumer->get());
  auto copied = gpu->make_event();
  copied->record(consumer->get());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(filled->done());
  EXPECT_FALSE(copied->done()) << "the consumer ran before the producer's event";
  release = true;
  copied->synchronize();
  EXPECT_TRUE(filled->done());
  for (int64_t i : {int64_t{0}, n / 2, n - 1}) EXPECT_EQ(host[i], 2.5f) << i;

  gpu->deallocate_after(a, n * 4, consumer->get());
  gpu->deallocate_after(b, n * 4, consumer->get());
  consumer->synchronize();
  EXPECT_EQ(gpu->bytes_in_use(), 0);
  gpu->deallocate_host(host, n * 4);
}

TEST(CudaStreams, DefaultStreamQueuesWithoutWaiting) {
  // default_stream() is the legacy default stream as an asynchronous handle: a fill queued on it behind a
  // held stream returns at once, and a synchronous copy (legacy stream) afterwards sees it.
  auto gpu = make_device("cuda");
  Stream legacy = gpu->default_stream();
  EXPECT_NE(legacy, nullptr);
  std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(legacy), hold_stream, &release), cudaSuccess);
  float* d = static_cast<float*>(gpu->allocate(4096 * 4));
  gpu->fill_zero(d, 4096 * 4, legacy);  // would hang here if it waited
  detail::kernels_of(*gpu).init_fill(d, FillSpec::constant(7.0), 1, 1, 0, 4096, legacy);
  auto after = gpu->make_event();
  after->record(legacy);
  EXPECT_FALSE(after->done());
  release = true;
  std::vector<float> host(4096);
  gpu->copy(host.data(), d, 4096 * 4);
  EXPECT_EQ(host[0], 7.0f);
  EXPECT_EQ(host[4095], 7.0f);
  EXPECT_TRUE(after->done());
  gpu->deallocate(d, 4096 * 4);
}

// make_device("cuda", stream): the device computes on the caller's stream. Everything given nullptr lands
// there (a kernel, an event, the synchronous copy's wait): held, the caller's stream holds them back. Then, with
// CUDA's legacy default stream held instead, the same calls complete: none of them needs it. (One stream is held
// at a time: CUDA may run every host function of a process on one thread.)
TEST(CudaStreams, TheDeviceComputesOnTheCallersStream) {
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), cudaSuccess);
  {
    auto gpu = make_device("cuda", mine);
    EXPECT_EQ(gpu->default_stream(), mine);
    const int64_t n = 1 << 20;
    std::vector<float> host(static_cast<size_t>(n));
    {
      std::atomic<bool> release{false};
      ASSERT_EQ(cudaLaunchHostFunc(mine, hold_stream, &release), cudaSuccess);
      float* d = static_cast<float*>(gpu->allocate(n * 4));
      detail::kernels_of(*gpu).init_fill(d, FillSpec::constant(3.0), 1, 1, 0, n, nullptr);
      auto mark = gpu->make_event();
      mark->record(nullptr);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_FALSE(mark->done()) << "an event recorded on nullptr did not land on the caller's stream";
      std::atomic<bool> copied{false};
      std::thread reader([&] {
        gpu->copy(host.data(), d, n * 4);  // synchronous: waits for the caller's stream, where the fill is
        copied = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_FALSE(copied) << "the synchronous copy did not wait for the caller's stream";
      release = true;
      reader.join();
      EXPECT_EQ(host[0], 3.0f);
      EXPECT_EQ(host[static_cast<size_t>(n) - 1], 3.0f);
      gpu->deallocate(d, n * 4);
    }
    {
      std::atomic<bool> release{false}, done{false};
      ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, hold_stream, &release), cudaSuccess);
      std::thread work([&] {
        float* d = static_cast<float*>(gpu->allocate(n * 4));
        detail::kernels_of(*gpu).init_fill(d, FillSpec::constant(5.0), 1, 1, 0, n, nullptr);
        gpu->fill_zero(d, 4, nullptr);
        gpu->copy(host.data(), d, n * 4);
        gpu->deallocate(d, n * 4);
        done = true;
      });
      for (int i = 0; i < 2000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_TRUE(done) << "the device needed CUDA's legacy default stream";
      release = true;
      work.join();
      ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);  // the host function is done with `release`
      EXPECT_EQ(host[0], 0.0f);
      EXPECT_EQ(host[static_cast<size_t>(n) - 1], 5.0f);
    }
    EXPECT_EQ(gpu->bytes_in_use(), 0);
  }
  ASSERT_EQ(cudaStreamDestroy(mine), cudaSuccess);
}

TEST(CudaStreams, AStreamOfAnotherDeviceIsRefused) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two GPUs";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  try {
    make_device("cuda:0", other);
    ADD_FAILURE() << "a stream of cuda:1 was taken for cuda:0";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to cuda:1"), std::string::npos) << e.what();
  }
  cudaStreamDestroy(other);
}

TEST(CudaStreams, HostMemoryIsPinned) {
  auto gpu = make_device("cuda");
  void* h = gpu->allocate_host(1 << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, h), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(gpu->bytes_in_use(), 0) << "host memory is not device memory";
  gpu->deallocate_host(h, 1 << 20);
}

}  // namespace
}  // namespace zero3

#else

TEST(CudaStreams, NotInThisBuild) {}

#endif

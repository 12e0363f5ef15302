// The stream, event, stream-ordered free and host-memory members of Device on the cpu device, where work
// completes in the call: streams are null, events are always done, frees take effect at once.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "zero3/device.hpp"

namespace zero3 {
namespace {

TEST(DeviceStreams, CpuStreamsAndEventsAreImmediate) {
  auto cpu = make_cpu_device();
  EXPECT_EQ(cpu->default_stream(), nullptr);
  auto stream = cpu->make_stream();
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(stream->get(), nullptr);
  stream->synchronize();
  auto event = cpu->make_event();
  ASSERT_NE(event, nullptr);
  EXPECT_TRUE(event->done());
  event->record(stream->get());
  event->wait_on(nullptr);
  event->synchronize();
  EXPECT_TRUE(event->done());
}

TEST(DeviceStreams, CpuDeallocateAfterFreesAtOnce) {
  auto cpu = make_cpu_device();
  void* p = cpu->allocate(1000);
  EXPECT_EQ(cpu->bytes_in_use(), 1000);
  cpu->deallocate_after(p, 1000, cpu->make_stream()->get());
  EXPECT_EQ(cpu->bytes_in_use(), 0);
  cpu->deallocate_after(nullptr, 0, nullptr);
}

TEST(DeviceStreams, CpuHostMemoryIsAlignedAndNotCounted) {
  auto cpu = make_cpu_device();
  EXPECT_EQ(cpu->allocate_host(0), nullptr);
  void* h = cpu->allocate_host(12345);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % 64, 0u);
  std::memset(h, 0xab, 12345);
  EXPECT_EQ(cpu->bytes_in_use(), 0);
  cpu->deallocate_host(h, 12345);
  cpu->deallocate_host(nullptr, 0);
}

}  // namespace
}  // namespace zero3

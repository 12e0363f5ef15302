// The stream, event, stream-ordered free and host-memory members of Device on the cpu device, where work
// completes in the call: streams are null, events are always done, frees take effect at once. A compute stream
// is for a cuda device only, and the engine refuses a Device that zero3 did not make.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "support/engine_world.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

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

TEST(DeviceStreams, TheCpuDeviceTakesNoComputeStream) {
  auto* not_a_stream = reinterpret_cast<Stream>(uintptr_t{0x1000});
  try {
    make_device("cpu", not_a_stream);
    ADD_FAILURE() << "the cpu device took a compute stream";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the cpu device has no streams"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_device("cpu", nullptr)->type(), DeviceType::cpu);
}

// A Device implemented outside zero3: the interface is public, the engine's kernels are not.
class ForeignDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::cpu; }
  int index() const override { return 0; }
  std::string name() const override { return "foreign"; }
  void* allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) noexcept override { inner_->deallocate(ptr, bytes); }
  void copy(void* dst, const void* src, size_t bytes, Stream) override { inner_->copy(dst, src, bytes); }
  void move(void* dst, const void* src, size_t bytes, Stream) override { inner_->move(dst, src, bytes); }
  void fill_zero(void* ptr, size_t bytes, Stream) override { inner_->fill_zero(ptr, bytes); }
  void synchronize() override {}
  int64_t bytes_in_use() const override { return inner_->bytes_in_use(); }
  int64_t peak_bytes_in_use() const override { return inner_->peak_bytes_in_use(); }

 private:
  std::unique_ptr<Device> inner_ = make_cpu_device();
};

TEST(DeviceStreams, TheEngineRefusesADeviceZero3DidNotMake) {
  ForeignDevice device;
  Config c;
  c.gradient_clipping = 1.0;
  c.train_micro_batch_size_per_gpu = 1;
  CommOptions o;
  o.backend = "local";
  LaunchInfo launch;
  std::shared_ptr<Communicator> comm = make_communicator(o, launch, nullptr);
  try {
    Engine engine(testing::resolved_for(c, *comm), comm, device);
    ADD_FAILURE() << "the engine took a device zero3 did not make";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("device \"foreign\" is not one of zero3's devices"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero3

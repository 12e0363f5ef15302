// The training program's sums of host numbers over the ranks (all_reduce_host_sum, step_loss_normalizer) on the
// stream-path test device (support/stream_path_device.hpp: a device that reports itself as cuda, with a
// communicator that reports nccl and counts collectives given memory that is not the device's): on a GPU the
// values must reach the communicator in device memory (NCCL reads no host memory) and come back on the host,
// with no device memory left behind; on the cpu device (or none named) they are reduced in place.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "engine_model.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"

using namespace llama3;

namespace {

std::shared_ptr<zero3::Communicator> world_of_one() {
  zero3::CommOptions o;
  o.backend = "local";
  o.timeout = std::chrono::seconds(30);
  return zero3::make_communicator(o, zero3::LaunchInfo{}, nullptr);
}

}  // namespace

TEST(HostReductions, GoThroughDeviceMemoryOnAGpu) {
  zero3::testing::StreamPathDevice device;
  zero3::testing::StreamPathComm comm(world_of_one(), device);
  float values[3] = {1.5f, -2.0f, 65536.0f};
  all_reduce_host_sum(comm, &device, values, 3);
  EXPECT_EQ(values[0], 1.5f);  // the sum over one rank
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], 65536.0f);
  EXPECT_EQ(comm.host_memory_collectives(), 0);

  // 3 x 2^16 + 5 targets over 2 micro-batches: the two 16-bit halves travel as floats and come back exact.
  EXPECT_EQ(step_loss_normalizer(comm, 3 * 65536 + 5, 2, &device), (3.0 * 65536 + 5) / 2);
  EXPECT_EQ(comm.host_memory_collectives(), 0);
  device.synchronize();
  EXPECT_EQ(device.bytes_in_use(), 0) << "the staging buffer was not given back";

  // Without the device the values go to the communicator as they are: host memory, which NCCL cannot read.
  all_reduce_host_sum(comm, nullptr, values, 3);
  EXPECT_EQ(comm.host_memory_collectives(), 1);
  const zero3::testing::StreamPathUsage u = device.usage();
  EXPECT_EQ(u.frees_while_queued + u.waits_before_record + u.syncs_before_record, 0);
}

TEST(HostReductions, InPlaceOnTheCpuDevice) {
  std::unique_ptr<zero3::Device> cpu = zero3::make_cpu_device();
  std::shared_ptr<zero3::Communicator> comm = world_of_one();
  float values[2] = {7.0f, 0.25f};
  all_reduce_host_sum(*comm, cpu.get(), values, 2);
  EXPECT_EQ(values[0], 7.0f);
  EXPECT_EQ(values[1], 0.25f);
  EXPECT_EQ(step_loss_normalizer(*comm, 1000, 4, cpu.get()), 250.0);
  EXPECT_EQ(step_loss_normalizer(*comm, 1000, 4), 250.0);
  EXPECT_EQ(cpu->bytes_in_use(), 0);
}

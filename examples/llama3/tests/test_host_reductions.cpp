// The training program's count of loss targets over the ranks (step_loss_normalizer), which travels through the
// engine's ordered queue (Engine::all_reduce_host): exact beyond what one float holds (3 x 2^16 + 5 targets as two
// 16-bit halves). On the stream-path test device (support/stream_path_device.hpp: a device that reports itself as
// cuda, with a communicator that reports nccl and counts collectives given memory that is not the device's) the
// counts must reach the communicator in device memory (NCCL reads no host memory) and no device memory may be left
// behind; on the cpu device they are reduced in place.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "engine_model.hpp"
#include "support/engine_world.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/comm.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"

using namespace llama3;

namespace {

std::shared_ptr<zero3::Communicator> world_of_one() {
  zero3::CommOptions o;
  o.backend = "local";
  o.timeout = std::chrono::seconds(30);
  return zero3::make_communicator(o, zero3::LaunchInfo{}, nullptr);
}

zero3::Config one_rank_config() {
  zero3::Config c;
  c.zero.stage = 3;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = 2;
  return c;
}

}  // namespace

TEST(HostReductions, GoThroughDeviceMemoryOnAGpu) {
  zero3::testing::StreamPathDevice device;
  {
    auto comm = std::make_shared<zero3::testing::StreamPathComm>(world_of_one(), device);
    zero3::Engine engine(zero3::testing::resolved_for(one_rank_config(), *comm), comm, device);
    EXPECT_EQ(step_loss_normalizer(engine, 3 * 65536 + 5, 2), (3.0 * 65536 + 5) / 2);
    EXPECT_EQ(comm->host_memory_collectives(), 0);
    EXPECT_THROW(step_loss_normalizer(engine, -1, 2), zero3::InvalidArgument);
    EXPECT_THROW(step_loss_normalizer(engine, 1, 0), zero3::InvalidArgument);
  }
  device.synchronize();
  EXPECT_EQ(device.bytes_in_use(), 0) << "the staging buffer was not given back";
  const zero3::testing::StreamPathUsage u = device.usage();
  EXPECT_EQ(u.frees_while_queued + u.waits_before_record + u.syncs_before_record, 0);
}

TEST(HostReductions, InPlaceOnTheCpuDevice) {
  std::unique_ptr<zero3::Device> cpu = zero3::make_cpu_device();
  std::shared_ptr<zero3::Communicator> comm = world_of_one();
  zero3::Engine engine(zero3::testing::resolved_for(one_rank_config(), *comm), comm, *cpu);
  EXPECT_EQ(step_loss_normalizer(engine, 1000, 4), 250.0);
  EXPECT_EQ(step_loss_normalizer(engine, 0, 4), 0.0);
  EXPECT_EQ(cpu->bytes_in_use(), 0);
}

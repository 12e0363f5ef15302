// The "local" backend (a world of one) and the backend registry, as the engine sees them single-rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

std::unique_ptr<Communicator> local_comm() {
  CommOptions options;
  options.backend = "local";
  return make_communicator(options, LaunchInfo{}, nullptr);
}

TEST(LocalCommunicator, IdentityCollectives) {
  auto comm = local_comm();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_STREQ(comm->backend(), "local");

  std::vector<float> in(7), out(7, -1.0f);
  std::iota(in.begin(), in.end(), 1.0f);
  comm->all_gather_into(out.data(), in.data(), in.size(), DType::f32)->wait();
  EXPECT_EQ(out, in);

  std::fill(out.begin(), out.end(), -1.0f);
  comm->reduce_scatter(out.data(), in.data(), in.size(), DType::f32, ReduceOp::avg)->wait();
  EXPECT_EQ(out, in);

  std::vector<uint16_t> half = {1, 2, 3};
  auto work = comm->all_reduce(half.data(), half.size(), DType::bf16, ReduceOp::max);
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(work->wait_for(std::chrono::milliseconds(0)));
  EXPECT_EQ(half, (std::vector<uint16_t>{1, 2, 3}));

  comm->broadcast(half.data(), half.size(), DType::f16, 0)->wait();
  comm->barrier();
  // In place: the rank's slice of the output is the input.
  comm->all_gather_into(out.data(), out.data(), out.size(), DType::f32)->wait();
  EXPECT_EQ(out, in);
}

TEST(LocalCommunicator, RejectsBadArguments) {
  auto comm = local_comm();
  float x = 0;
  EXPECT_THROW(comm->broadcast(&x, 1, DType::f32, 1), InvalidArgument);
  EXPECT_THROW(comm->reduce_scatter(&x, &x, 1, DType::f32, ReduceOp::max), InvalidArgument);
  EXPECT_THROW(comm->all_reduce(nullptr, 3, DType::f32, ReduceOp::sum), InvalidArgument);
  // A zero count needs no buffer.
  EXPECT_NO_THROW(comm->all_reduce(nullptr, 0, DType::f32, ReduceOp::sum)->wait());
  std::vector<float> buf(4);
  EXPECT_THROW(comm->all_gather_into(buf.data(), buf.data() + 1, 3, DType::f32), InvalidArgument);
}

TEST(LocalCommunicator, Split) {
  auto comm = local_comm();
  EXPECT_EQ(comm->split(-1, 0), nullptr);
  auto sub = comm->split(3, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->timeout(), comm->timeout());
}

TEST(BackendRegistry, LocalIsAlwaysAvailable) {
  auto names = available_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "local"), names.end());
}

TEST(BackendRegistry, AutoForOneHostRankIsLocalOrNccl) {
  auto comm = make_communicator(CommOptions{}, LaunchInfo{}, nullptr);
  std::string name = comm->backend();
  EXPECT_TRUE(name == "local" || name == "nccl") << name;
}

TEST(BackendRegistry, UnknownBackendListsAvailable) {
  CommOptions options;
  options.backend = "mpi";
  try {
    make_communicator(options, LaunchInfo{}, nullptr);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("\"mpi\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("local"), std::string::npos) << msg;
  }
}

TEST(BackendRegistry, LocalRefusesSeveralRanks) {
  CommOptions options;
  options.backend = "local";
  LaunchInfo launch;
  launch.world_size = 2;
  EXPECT_THROW(make_communicator(options, launch, nullptr), CommError);
  launch.rank = 2;
  EXPECT_THROW(make_communicator(options, launch, nullptr), CommError);
}

TEST(CompletedWork, IsComplete) {
  auto w = completed_work();
  EXPECT_TRUE(w->is_completed());
  EXPECT_NO_THROW(w->wait());
}

}  // namespace
}  // namespace zero3

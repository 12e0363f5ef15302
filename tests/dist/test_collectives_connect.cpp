// connect(): the one call a training program makes. It reads the launcher's variables, opens the store on
// rank 0 and returns the backend "auto" picks: local for one process, else gloo (no GPU here).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "zero3/comm.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using namespace std::chrono_literals;

bool has_backend(const std::string& name) {
  auto b = available_backends();
  return std::find(b.begin(), b.end(), name) != b.end();
}

TEST(Connect, JoinsTheJobWithTheAutomaticBackend) {
  LaunchInfo launch = detect_launch();
  if (launch.world_size > 1 && !has_backend("gloo") && !has_backend("nccl")) GTEST_SKIP() << "no multi-rank backend";
  CommOptions options;
  options.timeout = 60s;
  auto comm = connect(options);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), launch.rank);
  EXPECT_EQ(comm->size(), launch.world_size);
  EXPECT_EQ(log::rank(), launch.rank);
  std::string backend = comm->backend();
  if (!has_backend("nccl")) {
    EXPECT_EQ(backend, launch.world_size == 1 ? "local" : "gloo");
  }

  float v = static_cast<float>(comm->rank() + 1);
  comm->all_reduce(&v, 1, DType::f32, ReduceOp::sum)->wait();
  EXPECT_EQ(v, comm->size() * (comm->size() + 1) / 2.0f);
  comm->barrier();
}

TEST(Connect, ExplicitGlooEvenForOneRank) {
  if (!has_backend("gloo")) GTEST_SKIP() << "no gloo in this build";
  // Every rank connects a second time: the store of the first communicator is gone, rank 0 serves anew.
  CommOptions options;
  options.backend = "gloo";
  options.timeout = 60s;
  auto comm = connect(options);
  EXPECT_STREQ(comm->backend(), "gloo");
  std::vector<uint16_t> halves(3, f32_to_bf16(static_cast<float>(comm->rank() + 1)));
  comm->all_reduce(halves.data(), halves.size(), DType::bf16, ReduceOp::max)->wait();
  EXPECT_EQ(bf16_to_f32(halves[2]), static_cast<float>(comm->size()));
}

}  // namespace
}  // namespace zero3

// A rank that dies in the middle of a collective: the others must fail with a clear CommError well within
// their timeout, never hang. The launcher stops every rank as soon as one fails, so the scenario runs only
// when a unit test (test_launch_command) starts it under `zero3 launch --keep-going` with
// DIST_TEST_DYING_RANK set; under plain ctest it is skipped.
// zero3-test-ranks: 2
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/store.hpp"

namespace zero3 {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = 20s;

TEST(RankFailure, OthersSeeAClearErrorWithinTheTimeout) {
  const char* dying_text = std::getenv("DIST_TEST_DYING_RANK");
  if (!dying_text) GTEST_SKIP() << "runs under test_launch_command (DIST_TEST_DYING_RANK)";
  auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  const int dying = std::atoi(dying_text);

  LaunchInfo launch = detect_launch();
  log::set_rank(launch.rank);
  ASSERT_GT(launch.world_size, dying);
  auto store = make_tcp_store(launch.master_addr, launch.store_port, launch.rank == 0, kTimeout);
  CommOptions options;
  options.backend = "gloo";
  options.timeout = kTimeout;
  auto comm = make_communicator(options, launch, store);

  // One collective that works, so every connection is up.
  float one = 1;
  comm->all_reduce(&one, 1, DType::f32, ReduceOp::sum)->wait();
  ASSERT_EQ(one, static_cast<float>(launch.world_size));

  // 64 MiB per rank: the transfer is still under way when the dying rank leaves.
  std::vector<float> big(16 << 20, 1.0f);
  auto t0 = Clock::now();
  auto work = comm->all_reduce(big.data(), big.size(), DType::f32, ReduceOp::sum);
  if (launch.rank == dying) {
    std::this_thread::sleep_for(20ms);
    std::printf("rank %d leaves in the middle of all_reduce\n", launch.rank);
    std::fflush(stdout);
    ::_exit(42);
  }
  try {
    work->wait();
    ADD_FAILURE() << "the all_reduce succeeded although rank " << dying << " died";
  } catch (const CommError& e) {
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    std::printf("rank %d saw after %lld ms: %s\n", launch.rank, static_cast<long long>(took.count()), e.what());
    std::fflush(stdout);
    EXPECT_LT(took, kTimeout);
    EXPECT_NE(std::string(e.what()).find("all_reduce(count=16777216, dtype=f32, op=sum)"), std::string::npos);
  }
  // The communicator knows it is broken, and says why at once.
  auto t1 = Clock::now();
  EXPECT_THROW(comm->all_reduce(&one, 1, DType::f32, ReduceOp::sum)->wait(), CommError);
  EXPECT_LT(Clock::now() - t1, 1s);
}

}  // namespace
}  // namespace zero3

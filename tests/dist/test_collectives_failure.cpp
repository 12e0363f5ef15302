// A rank that dies in the middle of a collective: the others must fail with a clear CommError well within
// their timeout, never hang. The launcher stops every rank as soon as one fails, so the scenarios run only
// when a unit test (test_launch_command) starts them under `zero3 launch --keep-going` with
// DIST_TEST_DYING_RANK or DIST_TEST_DEAD_RECEIVER set; under plain ctest they are skipped.
// zero3-test-ranks: 2
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
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

// The sender's side of a dead peer: rank 0 broadcasts 256 MiB to rank 1, which dies (its process exits) as soon as
// the first bytes arrived. Rank 0 only sends, and most of the data is still queued in gloo for the dead connection:
// gloo fails the operations waiting for a broken connection, but not a send it has already taken up, so rank 0
// would wait for its comm timeout were its wait not ended by the communicator's watch of its peers. The broadcast
// must fail with a CommError naming the dead rank, long before the timeout (120 s: far above what it takes, and
// short enough that a wait that is not ended fails this test within ctest's limit).
TEST(RankFailure, ASendToARankThatDiesFailsAtOnce) {
  const char* dying_text = std::getenv("DIST_TEST_DEAD_RECEIVER");
  if (!dying_text) GTEST_SKIP() << "runs under test_launch_command (DIST_TEST_DEAD_RECEIVER)";
  auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  const int dying = std::atoi(dying_text);
  LaunchInfo launch = detect_launch();
  log::set_rank(launch.rank);
  ASSERT_EQ(launch.world_size, 2);
  ASSERT_NE(dying, 0) << "rank 0 is the root";
  CommOptions options;
  options.backend = "gloo";
  options.timeout = 120s;
  auto comm = connect(options);

  std::vector<float> data(64 << 20, launch.rank == 0 ? 1.0f : 0.0f);
  auto t0 = Clock::now();
  auto work = comm->broadcast(data.data(), data.size(), DType::f32, 0);
  if (launch.rank == dying) {
    // The first segment has arrived (the call comparison is done and the data moves): leave.
    const volatile float* first = data.data();
    while (*first == 0.0f) std::this_thread::yield();
    std::printf("rank %d leaves in the middle of a broadcast\n", launch.rank);
    std::fflush(stdout);
    ::_exit(43);
  }
  try {
    work->wait();
    ADD_FAILURE() << "the broadcast succeeded although rank " << dying << " died";
  } catch (const CommError& e) {
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    std::printf("rank %d saw after %lld ms: %s\n", launch.rank, static_cast<long long>(took.count()), e.what());
    std::fflush(stdout);
    EXPECT_LT(took, 60s) << "far below the timeout";
    EXPECT_NE(std::string(e.what()).find("broadcast(count=67108864, dtype=f32, root=0)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(dying) + " closed"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero3

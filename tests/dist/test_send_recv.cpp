// Point-to-point transfers (Communicator::send_recv) on 1-4 real processes started by `zero3 launch`: a ring shift
// and a pipeline's chain of activations forward and gradients backward with exact values, a transfer to itself,
// mixed with collectives, the two sides disagreeing (named on both, the communicator still usable), a peer that
// stalls (a TimeoutError naming the transfer) and, when test_launch_command starts it with DIST_TEST_KILLED_PEER,
// a peer killed in the middle of a transfer (a CommError naming it on its neighbours, well within the timeout).
// zero3-test-ranks: 1 2 3 4
// zero3-test-nodes: 2x2
// zero3-test-labels: pipeline
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/store.hpp"

namespace zero3 {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool has_backend(const std::string& name) {
  auto backends = available_backends();
  return std::find(backends.begin(), backends.end(), name) != backends.end();
}

struct World {
  LaunchInfo launch;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};
World* g_world = nullptr;

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!has_backend("gloo") || std::getenv("DIST_TEST_KILLED_PEER")) return;
    g_world = new World;
    g_world->launch = detect_launch();
    log::set_rank(g_world->launch.rank);
    g_world->store =
        make_tcp_store(g_world->launch.master_addr, g_world->launch.store_port, g_world->launch.rank == 0, 60s);
    CommOptions options;
    options.backend = g_world->launch.world_size == 1 ? "local" : "gloo";
    options.timeout = 60s;
    g_world->comm = make_communicator(options, g_world->launch, g_world->store);
  }
  void TearDown() override {
    if (g_world) g_world->comm.reset();
    delete g_world;
    g_world = nullptr;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

class SendRecv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!g_world) GTEST_SKIP() << "no gloo in this build, or the killed-peer scenario runs instead";
    comm_ = g_world->comm.get();
    rank_ = comm_->rank();
    size_ = comm_->size();
  }
  // A test that fails on one rank fails on all of them.
  void TearDown() override {
    if (!comm_) return;
    float failed = HasFailure() ? 1.0f : 0.0f;
    comm_->all_reduce(&failed, 1, DType::f32, ReduceOp::max)->wait();
    if (failed > 0 && !HasFailure()) ADD_FAILURE() << "another rank failed this test";
  }

  Communicator* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

// Element i of what rank r sends as message m: distinct for every (rank, message, element), exact in f32.
float value(int rank, int message, size_t i) { return static_cast<float>(rank * 100000 + message * 1000) + i; }

// Every rank sends to its right neighbour and receives from its left one in one call (on one rank: to itself).
TEST_F(SendRecv, RingShiftInOneCall) {
  const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
  for (size_t count : {size_t{1}, size_t{7}, size_t{300}, size_t{1} << 20}) {
    std::vector<float> out(count), in(count, -1.0f);
    for (size_t i = 0; i < count; ++i) out[i] = value(rank_, 0, i);
    comm_
        ->send_recv({PeerTransfer::send_to(right, out.data(), count, DType::f32, 3),
                     PeerTransfer::recv_from(left, in.data(), count, DType::f32, 3)})
        ->wait();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], value(left, 0, i)) << "count " << count << " element " << i;
  }
}

// A pipeline over the ranks: 4 micro-batches of activations go forward along 0 -> 1 -> ... -> size-1, each stage
// adding its rank, one call per transfer (tag = micro-batch); then their gradients come back in bf16.
TEST_F(SendRecv, ChainForwardAndBackward) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  constexpr int kMicroBatches = 4;
  constexpr size_t kCount = 4099;
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<float> act(kCount);
    if (rank_ == 0) {
      for (size_t i = 0; i < kCount; ++i) act[i] = value(0, m, i);
    } else {
      comm_->recv(act.data(), kCount, DType::f32, rank_ - 1, static_cast<uint32_t>(m))->wait();
      for (size_t i = 0; i < kCount; ++i) act[i] += static_cast<float>(rank_);
    }
    if (rank_ + 1 < size_) {
      comm_->send(act.data(), kCount, DType::f32, rank_ + 1, static_cast<uint32_t>(m))->wait();
    } else {
      const float added = static_cast<float>(size_ * (size_ - 1) / 2);
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(act[i], value(0, m, i) + added) << "micro-batch " << m;
    }
  }
  // Gradients backward: small integers, exact in bf16; each stage adds one.
  for (int m = kMicroBatches - 1; m >= 0; --m) {
    std::vector<uint16_t> grad(kCount);
    const uint32_t tag = 1000 + static_cast<uint32_t>(m);
    if (rank_ == size_ - 1) {
      for (size_t i = 0; i < kCount; ++i) grad[i] = f32_to_bf16(static_cast<float>(m + (i % 7)));
    } else {
      comm_->recv(grad.data(), kCount, DType::bf16, rank_ + 1, tag)->wait();
      for (size_t i = 0; i < kCount; ++i) grad[i] = f32_to_bf16(bf16_to_f32(grad[i]) + 1.0f);
    }
    if (rank_ > 0) {
      comm_->send(grad.data(), kCount, DType::bf16, rank_ - 1, tag)->wait();
    } else {
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(bf16_to_f32(grad[i]), static_cast<float>(m + (i % 7) + size_ - 1)) << "micro-batch " << m;
      }
    }
  }
}

// Works queued without waiting in between complete in issue order; collectives in between keep their own count.
TEST_F(SendRecv, InterleavedWithCollectives) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  constexpr size_t kCount = 513;
  std::vector<std::vector<float>> sent(3, std::vector<float>(kCount)), got(3, std::vector<float>(kCount, -1.0f));
  std::vector<WorkPtr> works;
  float sum = 1.0f;
  for (int m = 0; m < 3; ++m) {
    for (size_t i = 0; i < kCount; ++i) sent[m][i] = value(rank_, m, i);
    if (rank_ == 0) works.push_back(comm_->send(sent[m].data(), kCount, DType::f32, 1, static_cast<uint32_t>(m)));
    if (rank_ == 1) works.push_back(comm_->recv(got[m].data(), kCount, DType::f32, 0, static_cast<uint32_t>(m)));
    if (m == 1) works.push_back(comm_->all_reduce(&sum, 1, DType::f32, ReduceOp::sum));
  }
  for (auto& w : works) w->wait();
  EXPECT_EQ(sum, static_cast<float>(size_));
  if (rank_ == 1) {
    for (int m = 0; m < 3; ++m) {
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[m][i], value(0, m, i));
    }
  }
}

// A send and a receive to this rank itself in one call are a copy; other ranks need not take part.
TEST_F(SendRecv, ToItself) {
  std::vector<float> out(100), in(100, 0.0f);
  for (size_t i = 0; i < out.size(); ++i) out[i] = value(rank_, 9, i);
  comm_
      ->send_recv({PeerTransfer::recv_from(rank_, in.data(), 100, DType::f32, 4),
                   PeerTransfer::send_to(rank_, out.data(), 100, DType::f32, 4)})
      ->wait();
  EXPECT_EQ(in, out);
  comm_->send_recv({})->wait();  // nothing to do
}

TEST_F(SendRecv, BadArgumentsAreNamedBeforeAnythingMoves) {
  float x = 1;
  try {
    comm_->send(&x, 1, DType::f32, size_, 0);
    ADD_FAILURE() << "a peer outside the ranks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("send(count=1, dtype=f32, tag=0) to rank " + std::to_string(size_) +
                                   " names a peer outside the communicator's ranks 0.." + std::to_string(size_ - 1)),
        std::string::npos)
        << e.what();
  }
  try {
    comm_->send(&x, 1, DType::f32, rank_, 0);
    ADD_FAILURE() << "a send to itself without its receive was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1 send(s) to this rank itself but 0 receive(s)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm_->recv(nullptr, 4, DType::f32, (rank_ + 1) % size_, 0), InvalidArgument);
  float y = 0;
  EXPECT_THROW(comm_->send_recv({PeerTransfer::send_to(rank_, &x, 1, DType::f32, 1),
                                 PeerTransfer::recv_from(rank_, &y, 1, DType::bf16, 1)}),
               InvalidArgument);
}

// Rank 0 sends with tag 5 what rank 1 expects with tag 6 (and, in the same call, one transfer that agrees): both
// name both sides, the agreeing transfer arrives, and the communicator still works.
TEST_F(SendRecv, DisagreeingSidesAreNamedOnBoth) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  if (rank_ > 1) return;
  const int peer = 1 - rank_;
  std::vector<float> a(64, static_cast<float>(rank_ + 1)), b(64, 0.0f), c(64, 0.0f);
  std::vector<PeerTransfer> call;
  if (rank_ == 0) {
    call = {PeerTransfer::send_to(peer, a.data(), 64, DType::f32, 5),
            PeerTransfer::recv_from(peer, c.data(), 64, DType::f32, 8)};
  } else {
    call = {PeerTransfer::recv_from(peer, b.data(), 64, DType::f32, 6),
            PeerTransfer::send_to(peer, a.data(), 64, DType::f32, 8)};
  }
  try {
    comm_->send_recv(call)->wait();
    ADD_FAILURE() << "the disagreeing transfer succeeded";
  } catch (const CollectiveMismatchError& e) {
    const std::string what = e.what();
    // "(its transfer #N in that direction)": N counts this communicator's earlier transfers between the two.
    const std::string mine = rank_ == 0 ? "this rank's send(count=64, dtype=f32, tag=5) to rank 1 (its transfer #"
                                        : "this rank's recv(count=64, dtype=f32, tag=6) from rank 0 (its transfer #";
    const std::string theirs = rank_ == 0
                                   ? " in that direction) met rank 1's recv(count=64, dtype=f32, tag=6) from rank 0"
                                   : " in that direction) met rank 0's send(count=64, dtype=f32, tag=5) to rank 1";
    EXPECT_NE(what.find(mine), std::string::npos) << what;
    EXPECT_NE(what.find(theirs), std::string::npos) << what;
    EXPECT_NE(what.find("those transfers moved nothing, the others completed"), std::string::npos) << what;
  }
  EXPECT_EQ(b, std::vector<float>(64, 0.0f)) << "the disagreeing transfer moved data";
  if (rank_ == 0) {
    EXPECT_EQ(c, std::vector<float>(64, 2.0f)) << "the agreeing transfer did not arrive";
  }
  // Still usable: the next transfer pair meets.
  std::vector<float> d(3, -1.0f);
  if (rank_ == 0) comm_->send(a.data(), 3, DType::f32, 1, 7)->wait();
  if (rank_ == 1) {
    comm_->recv(d.data(), 3, DType::f32, 0, 7)->wait();
    EXPECT_EQ(d, std::vector<float>(3, 1.0f));
  }
}

// Rank 1 never sends what rank 0 waits for: rank 0's receive fails with a TimeoutError naming it after the
// (short) timeout of a communicator of its own; rank 1 is told to go on through the job's communicator.
TEST_F(SendRecv, AStalledPeerIsATimeoutNamingTheTransfer) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  CommOptions options;
  options.backend = "gloo";
  options.timeout = 1500ms;
  auto stalled = make_communicator(options, g_world->launch, g_world->store);
  if (rank_ == 0) {
    float x = 0;
    const auto t0 = Clock::now();
    try {
      stalled->recv(&x, 1, DType::f32, 1, 42)->wait();
      ADD_FAILURE() << "the receive completed although nothing was sent";
    } catch (const TimeoutError& e) {
      const auto took = Clock::now() - t0;
      EXPECT_GE(took, 1400ms);
      EXPECT_LT(took, 10s);
      EXPECT_NE(std::string(e.what()).find("recv(count=1, dtype=f32, tag=42) from rank 1"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("timed out after 1500 ms"), std::string::npos) << e.what();
    }
  }
  float done = 0;
  comm_->all_reduce(&done, 1, DType::f32, ReduceOp::sum)->wait();
}

// Started by test_launch_command under `zero3 launch -n 3 --keep-going` with DIST_TEST_KILLED_PEER=1: the middle
// stage of a pipeline is killed (SIGKILL) while it receives 64 MiB from rank 0 and before it sends to rank 2. Rank 0
// (whose send is under way) and rank 2 (waiting for its receive) must each fail with a CommError naming the
// transfer and rank 1, well within their 120 s timeout.
TEST(SendRecvFailure, AKilledPeerIsNamedOnItsNeighbours) {
  const char* killed_text = std::getenv("DIST_TEST_KILLED_PEER");
  if (!killed_text) GTEST_SKIP() << "runs under test_launch_command (DIST_TEST_KILLED_PEER)";
  if (!has_backend("gloo")) GTEST_SKIP() << "no gloo in this build";
  const int killed = std::atoi(killed_text);
  LaunchInfo launch = detect_launch();
  log::set_rank(launch.rank);
  ASSERT_EQ(launch.world_size, 3);
  ASSERT_EQ(killed, 1) << "the scenario kills the middle stage";
  CommOptions options;
  options.backend = "gloo";
  options.timeout = 120s;
  auto comm = connect(options);

  std::vector<float> data(16 << 20, launch.rank == 0 ? 1.0f : 0.0f);
  const auto t0 = Clock::now();
  WorkPtr work;
  if (launch.rank == 0) work = comm->send(data.data(), data.size(), DType::f32, 1, 7);
  if (launch.rank == 1) {
    work = comm->recv(data.data(), data.size(), DType::f32, 0, 7);
    const volatile float* first = data.data();
    while (*first == 0.0f) std::this_thread::yield();  // the data moves
    std::printf("rank 1 is killed in the middle of a receive\n");
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
  if (launch.rank == 2) work = comm->recv(data.data(), 1024, DType::f32, 1, 8);
  try {
    work->wait();
    ADD_FAILURE() << "the transfer succeeded although rank 1 was killed";
  } catch (const CommError& e) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    std::printf("rank %d saw after %lld ms: %s\n", launch.rank, static_cast<long long>(took.count()), e.what());
    std::fflush(stdout);
    EXPECT_LT(took, 60s) << "far below the timeout";
    const std::string what = e.what();
    const std::string transfer = launch.rank == 0 ? "send(count=16777216, dtype=f32, tag=7) to rank 1"
                                                  : "recv(count=1024, dtype=f32, tag=8) from rank 1";
    EXPECT_NE(what.find(transfer), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 closed"), std::string::npos) << what;
    EXPECT_EQ(what.find("timed out after"), std::string::npos) << "a dead peer reported as a timeout: " << what;
  }
}

}  // namespace
}  // namespace zero3

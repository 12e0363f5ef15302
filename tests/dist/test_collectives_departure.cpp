// Ranks that leave a Gloo communicator as soon as they have it: every other rank gets a working communicator
// (connect ends only when every rank watches every peer, so no rank can be left with a receive it cannot post and
// gloo's raw "Connection closed by peer"), learns that those ranks destroyed it (their goodbye, not a crash), and
// destroys its own without an error. Twenty rounds, each on a communicator of its own (split of the world), with
// the last rank as the one that stays: the rounds give a rank that is slow to finish connecting many chances to
// meet peers that have already gone.
// zero3-test-ranks: 2 3 4
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "zero3/comm.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using namespace std::chrono_literals;

TEST(Departure, PeersThatLeaveAtOnceAreADepartureNotAnError) {
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  CommOptions options;
  options.backend = "gloo";
  options.timeout = 60s;
  std::unique_ptr<Communicator> world = connect(options);
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const int stays = world->size() - 1;
  for (int round = 0; round < 20; ++round) {
    std::unique_ptr<Communicator> comm;
    try {
      comm = world->split(0, world->rank());
    } catch (const std::exception& e) {
      FAIL() << "round " << round << ": connecting failed: " << e.what();
    }
    ASSERT_NE(comm, nullptr);
    if (world->rank() != stays) {
      comm.reset();  // says goodbye and closes the connections at once
    } else {
      float x = 1;
      try {
        comm->all_reduce(&x, 1, DType::f32, ReduceOp::sum)->wait();
        ADD_FAILURE() << "round " << round << ": an all_reduce with ranks that had left completed";
      } catch (const CommError& e) {
        EXPECT_TRUE(std::regex_search(e.what(), std::regex("rank \\d+.* ha(s|ve) destroyed this communicator")))
            << "round " << round << ": the error does not say that the peers left: " << e.what();
      }
      comm.reset();  // the peers are gone: no error, no abort
    }
    world->barrier();
  }
}

}  // namespace
}  // namespace zero3

// The timeout fires at its setting, not later: a collective that a peer never joins ends in a TimeoutError on
// the waiting rank within 2 s of zero3.comm_timeout_s, as the training example sees it, with the error
// propagating out of the function that owns the engine and the communicator. The report that led here: 20 s set,
// 30.2 s observed. The 10 s were the store server's linger: rank 0 serves the store, and while the error unwound
// through the communicator the server waited up to 10 s for the silent rank's connection to close, before the
// error reached the caller.
// zero3-test-ranks: 2
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kTimeout = 3s;

// Joins, trains one step (which gathers the next micro-step's first units), then (rank 0) enters the forward
// scopes until the all-gather rank 1 never joins (the unit after those first ones, issued ahead when the first
// scope opens) fails; the error leaves this function, destroying the engine, the communicator and rank 0's store
// on the way. `issued`: when the first scope was entered; `late`: the unit whose gather fails.
void train_until_a_peer_goes_silent(Clock::time_point* issued, std::string* late) {
  std::shared_ptr<Communicator> comm(connect(host_comm_options(kTimeout)));
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 1;
  c.zero.param_persistence_threshold = 0;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  mlp_micro_step(e, units, d, make_batch(d, 1, comm->rank(), 2));
  e.step();
  if (comm->rank() == 1) {
    // Silent but connected, for longer than the store server's linger (10 s) after rank 0's timeout.
    std::this_thread::sleep_for(kTimeout + 12s);
    return;
  }
  *late = e.unit(first_unit_not_gathered_ahead(e)).name;
  *issued = Clock::now();
  forward_along_the_order(e);
}

}  // namespace

TEST(TimeoutBound, TheErrorArrivesWithinTwoSecondsOfTheSetting) {
  Clock::time_point issued{};
  std::string message, late;
  try {
    train_until_a_peer_goes_silent(&issued, &late);
    if (detect_launch().rank == 1) return;
    ADD_FAILURE() << "the gather completed without rank 1";
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  const auto waited = Clock::now() - issued;
  EXPECT_NE(message.find("all_gather of unit '" + late + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out after 3000 ms"), std::string::npos) << message;
  EXPECT_GE(waited, kTimeout - 100ms) << message;
  EXPECT_LT(waited, kTimeout + 2s) << "the error arrived " << std::chrono::duration<double>(waited - kTimeout).count()
                                   << " s after the timeout: " << message;
}

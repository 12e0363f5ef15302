// A collective that a peer never joins ends in a TimeoutError naming the unit and the operation, on the
// rank that waited, instead of a hang. Rank 1 follows the first micro-step (so the order is recorded and
// checked) and its step(), which gathers the next micro-step's first units, then stops taking part; rank 0's
// gather of the unit after them (issued ahead when the first scope opens) times out.
// zero3-test-ranks: 2
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

TEST(Timeout, AGatherNobodyJoinsNamesTheUnit) {
  std::shared_ptr<Communicator> comm(connect(host_comm_options(std::chrono::seconds(2))));
  ASSERT_EQ(comm->size(), 2);
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
    // Gone silent: outlive rank 0's timeout, then leave without another collective.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return;
  }
  auto start = std::chrono::steady_clock::now();
  std::string message;
  const std::string late = e.unit(first_unit_not_gathered_ahead(e)).name;
  try {
    forward_along_the_order(e);
    ADD_FAILURE() << "the gathers completed without rank 1";
  } catch (const TimeoutError& err) {
    message = err.what();
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("all_gather of unit '" + late + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(") over all 2 ranks on rank 0 failed: "), std::string::npos) << "the group: " << message;
  EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
  EXPECT_LT(waited, 30.0);
  RecordProperty("message", message);
  // The engine stays failed with the same error.
  try {
    e.step();
    ADD_FAILURE() << "step() after a timeout should throw";
  } catch (const CommError& err) {
    EXPECT_EQ(std::string(err.what()), message);
  }
}

// A collective of a layout's group that a peer never joins ends in a TimeoutError naming the group (as
// test_engine_timeout.cpp for plain ZeRO-3). HSDP on 2 simulated nodes of 2: after one step (which gathers the next
// micro-step's first units) rank 1 goes silent; rank 0's next gather (the unit after them) runs within its node's
// shard group and names it ("... over the MiCS shard group of ranks
// 0, 1 on rank 0 failed: ..."). The ranks of node 1 fail at the boundary's all-reduce across the replicas, or at the
// step's agreement over every rank, whichever they reach first (timed out, or closed by rank 0 after its failure);
// either names its group.
// zero3-test-ranks:
// zero3-test-nodes: 2x2
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

TEST(LayoutTimeout, NamesTheLayoutsGroup) {
  const LaunchInfo launch = detect_launch();
  if (launch.local_world_size != 2 || launch.world_size != 4) GTEST_SKIP() << "runs on 2 simulated nodes of 2";
  std::shared_ptr<Communicator> comm(connect(host_comm_options(std::chrono::seconds(2))));
  Config c = equivalence_config(3);
  c.gradient_accumulation_steps = 1;
  c.zero.param_persistence_threshold = 0;
  c.zero.mics_shard_size = 2;
  Engine e(resolved_for(c, *comm), comm, cpu_device());
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  mlp_micro_step(e, units, d, make_batch(d, 1, comm->rank(), 4));
  e.step();
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(6));  // outlive every other rank's timeout
    return;
  }
  std::string message;
  const std::string late = e.unit(first_unit_not_gathered_ahead(e)).name;
  try {
    mlp_micro_step(e, units, d, make_batch(d, 2, comm->rank(), 4));
    e.step();
    ADD_FAILURE() << "the step completed without rank 1";
  } catch (const CommError& err) {  // rank 0: a TimeoutError; node 1: a timeout, or rank 0's closed connection
    if (comm->rank() == 0) {
      EXPECT_NE(dynamic_cast<const TimeoutError*>(&err), nullptr) << err.what();
    }
    message = err.what();
  }
  if (comm->rank() == 0) {
    EXPECT_NE(message.find("all_gather of unit '" + late + "' ("), std::string::npos) << message;
    EXPECT_NE(message.find(") over the MiCS shard group of ranks 0, 1 on rank 0 failed: "), std::string::npos)
        << message;
  } else {
    const std::string replicas = comm->rank() == 2 ? "0, 2" : "1, 3";
    EXPECT_TRUE(message.find(" over the MiCS replica group of ranks " + replicas + " on rank ") != std::string::npos ||
                message.find(" over all 4 ranks on rank ") != std::string::npos)
        << message;
  }
}

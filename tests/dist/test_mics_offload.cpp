// MiCS/HSDP with optimizer offload (mics_shard_size with offload_optimizer cpu or nvme, alone and with offload_param),
// on simulated nodes (and on one node of 4 with groups of half of it): shard groups of one node, replicated across the
// nodes, so every optimizer step all-reduces the gradient slices across the replicas. DeepSpeed refuses this
// combination at its first boundary ("Local sharding has no support for CPU offloading", runtime/zero/mics.py,
// MiCS_Optimizer.allreduce_mics_shard_grads: the gradient partitions it would all-reduce live in host memory). zero3
// all-reduces the slices on the device before they go down to the host optimizer, so only where Adam runs and where its
// state lives change.
//
// Every run must be bit-identical to MiCS without offload on the cpu device (losses, gradient norms, applied steps,
// final weights) and send the same bytes across nodes; on the stream-path test device (what the engine does on a
// GPU, run on the CPU: support/stream_path_device.hpp) the same bits, with the GPU's ordering rules kept.
// zero3-test-ranks: 4
// zero3-test-nodes: 2x2
// zero3-test-labels: engine
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/layouts.hpp"
#include "support/mlp_trainer.hpp"
#include "support/offload_tiers.hpp"
#include "support/planned_traffic.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/stream_path_checks.hpp"
#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Variant {
  std::string name;
  Where optimizer;
  Where param;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// HSDP over each simulated node (MiCS with a shard group of one node), three micro-steps per optimizer step, bf16
// compute (parameter offload to NVMe needs 16-bit slices), reductions in fp32.
Config mics_config() {
  Config c = equivalence_config(3);
  c.bf16.enabled = true;
  c.communication_data_type = DType::f32;
  c.gradient_accumulation_steps = 3;
  tight_schedule(c);
  hsdp_layout(c);
  return c;
}

class MicsOffload : public ::testing::TestWithParam<Variant> {};

TEST_P(MicsOffload, BitIdenticalToMicsWithoutOffload) {
  const Variant& v = GetParam();
  RankTempDir dir;
  const Config base = mics_config();
  ASSERT_GT(base.zero.mics_shard_size, 1);
  ASSERT_LT(base.zero.mics_shard_size, engine_world()->size()) << "the layout must have replicas";
  Config off = base;
  apply_offload(off, v.optimizer, v.param, /*pin=*/true, dir.path());
  TrainPlan plan;
  plan.world = engine_world()->size();
  plan.steps = 4;

  Trained want;
  {
    Engine engine(resolved_for(base, *engine_world()), engine_world(), cpu_device());
    want = train(engine, plan);
  }
  // On simulated nodes the replica all-reduce crosses them (on one node the groups are half of it).
  if (launcher_nodes().count > 1) {
    ASSERT_GT(want.stats.reduce_traffic.inter_node_bytes, 0) << "no gradient bytes crossed the nodes";
  }

  {
    SCOPED_TRACE("cpu device");
    Engine engine(resolved_for(off, *engine_world()), engine_world(), cpu_device());
    const Trained got = train(engine, plan);
    expect_same_run(got.run, want.run);
    EXPECT_EQ(got.stats.reduce_traffic.inter_node_bytes, want.stats.reduce_traffic.inter_node_bytes);
    EXPECT_EQ(got.stats.gather_traffic.inter_node_bytes, want.stats.gather_traffic.inter_node_bytes);
  }

  {
    SCOPED_TRACE("stream path");
    StreamPathDevice device(StreamSchedule::lazy);
    auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
    Trained got;
    {
      Engine engine(resolved_for(off, *comm), comm, device);
      got = train(engine, plan);
      device.synchronize();
    }
    EXPECT_EQ(device.bytes_in_use(), 0) << "the engine left device memory behind";
    EXPECT_EQ(device.host_bytes_in_use(), 0) << "the engine left pinned memory behind";
    expect_same_run(got.run, want.run);
    EXPECT_EQ(got.stats.reduce_traffic.inter_node_bytes, want.stats.reduce_traffic.inter_node_bytes);
    expect_gpu_ordering_rules(device.usage(), *comm);
    // The offload took place: Adam's state is off the device, in host memory for cpu.
    EXPECT_EQ(got.memory.optimizer_state, 0) << "Adam's state stayed on the device";
    if (v.optimizer == Where::cpu) {
      EXPECT_GT(got.memory.host_optimizer_state, 0);
    }
    EXPECT_EQ(device.usage().pageable_async_copies, 0) << "an asynchronous copy used pageable memory";
  }
}

const Variant kVariants[] = {
    {"optimizer_cpu", Where::cpu, Where::none},
    {"optimizer_nvme", Where::nvme, Where::none},
    {"both_cpu", Where::cpu, Where::cpu},  // the seed's offloads
    {"both_nvme", Where::nvme, Where::nvme},
};

INSTANTIATE_TEST_SUITE_P(Engine, MicsOffload, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace

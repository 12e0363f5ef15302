// ZeRO++ hpZ with parameter offload (zero_hpz_partition_size with offload_param cpu or nvme, the user's config plus
// the ZeRO++ keys), on simulated nodes. The secondary partition is filled by the first gather after each optimizer
// step from wherever the primary slice came (host memory, the NVMe swap), and serves the later gathers inside the
// node: on the device, or in pinned host memory with zero3.hpz_secondary_memory "host".
//
// Every run must be bit-identical to hpZ without offload on the cpu device (the same gathers of the same values,
// only the place the slices live changes) and send the same bytes across nodes. On the stream-path test device
// (what the engine does on a GPU, run on the CPU: support/stream_path_device.hpp) the GPU's ordering rules hold, the
// secondary partition is where the config says, and the engine's counters equal the memory plan's entries for it.
// zero3-test-ranks: 4
// zero3-test-nodes: 2x2
// zero3-test-labels: engine
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "support/checkpoint_testing.hpp"
#include "support/engine_model_desc.hpp"
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
#include "zero3/memory_plan.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

struct Variant {
  std::string name;
  Where param;
  Where optimizer;
  bool secondary_on_host;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// hpZ over each simulated node, every unit gathered again in backward (so that it reads the secondary partition),
// three micro-steps per optimizer step, bf16 compute (parameter offload to NVMe needs 16-bit slices).
Config hpz_config() {
  Config c = equivalence_config(3);
  c.bf16.enabled = true;
  c.communication_data_type = DType::f32;
  c.gradient_accumulation_steps = 3;
  tight_schedule(c);
  hpz_layout(c);
  return c;
}

// The bytes of hpZ's secondary partition on this rank, from the engine's units.
int64_t secondary_bytes(const Engine& engine, int64_t hpz) {
  int64_t total = 0;
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitInfo& u = engine.unit(UnitId{static_cast<int32_t>(i)});
    if (!u.persistent) total += u.padded_numel / hpz * static_cast<int64_t>(dtype_size(u.dtype));
  }
  return total;
}

class HpzOffload : public ::testing::TestWithParam<Variant> {};

TEST_P(HpzOffload, BitIdenticalToHpzWithoutOffload) {
  const Variant& v = GetParam();
  Config probe;
  if (!hpz_layout(probe)) GTEST_SKIP() << "hpZ needs two or more nodes";
  RankTempDir dir;
  const Config base = hpz_config();
  Config off = base;
  apply_offload(off, v.optimizer, v.param, /*pin=*/true, dir.path());
  off.zero3.hpz_secondary_on_host = v.secondary_on_host;
  TrainPlan plan;
  plan.world = engine_world()->size();
  plan.steps = 4;

  Trained want;
  {
    Engine engine(resolved_for(base, *engine_world()), engine_world(), cpu_device());
    want = train(engine, plan);
  }
  ASSERT_GT(want.stats.gather_traffic.intra_node_bytes, 0) << "no gather read the secondary partition";

  {
    SCOPED_TRACE("cpu device");
    Engine engine(resolved_for(off, *engine_world()), engine_world(), cpu_device());
    Trained got = train(engine, plan);
    expect_same_run(got.run, want.run);
    EXPECT_EQ(got.stats.gather_traffic.inter_node_bytes, want.stats.gather_traffic.inter_node_bytes);
    EXPECT_EQ(got.stats.gather_traffic.intra_node_bytes, want.stats.gather_traffic.intra_node_bytes);
  }

  for (StreamSchedule schedule : {StreamSchedule::lazy, StreamSchedule::eager_side_streams}) {
    SCOPED_TRACE(schedule == StreamSchedule::lazy ? "stream path, side streams run when waited for"
                                                  : "stream path, side streams run at once");
    StreamPathDevice device(schedule);
    auto comm = std::make_shared<StreamPathComm>(engine_world(), device);
    Trained got;
    int64_t secondary = 0;
    MemoryPlan mp;
    {
      Engine engine(resolved_for(off, *comm), comm, device);
      got = train(engine, plan);
      device.synchronize();
      secondary = secondary_bytes(engine, off.zero.hpz_partition_size);
      MemoryPlanOptions po;
      po.world_size = comm->size();
      po.ranks_per_node = launcher_nodes().per_node;
      mp = plan_memory(model_desc_of(engine), off, po);
    }
    EXPECT_EQ(device.bytes_in_use(), 0) << "the engine left device memory behind";
    EXPECT_EQ(device.host_bytes_in_use(), 0) << "the engine left pinned memory behind";
    expect_same_run(got.run, want.run);
    EXPECT_EQ(got.stats.gather_traffic.inter_node_bytes, want.stats.gather_traffic.inter_node_bytes);
    expect_gpu_ordering_rules(device.usage(), *comm);
    EXPECT_EQ(device.usage().pageable_async_copies, 0) << "an asynchronous copy used pageable memory";

    // Where the secondary partition lives, by the engine's counters and by the plan.
    ASSERT_GT(secondary, 0);
    int64_t planned_device = -1, planned_host = -1;
    for (const auto& e : mp.entries) {
      if (e.what.find("hpZ secondary partition") == std::string::npos) continue;
      (e.tier == MemoryTier::host ? planned_host : planned_device) = e.bytes;
    }
    if (v.secondary_on_host) {
      EXPECT_EQ(planned_host, secondary);
      EXPECT_EQ(planned_device, -1);
      // Host parameters: the secondary partition besides the offloaded slices (if any).
      EXPECT_GE(got.memory.host_params, secondary);
    } else {
      EXPECT_EQ(planned_device, secondary);
      EXPECT_EQ(planned_host, -1);
    }
  }
}

const Variant kVariants[] = {
    {"param_cpu", Where::cpu, Where::none, false},
    {"param_cpu_secondary_on_host", Where::cpu, Where::none, true},
    {"param_nvme", Where::nvme, Where::none, false},
    {"param_nvme_secondary_on_host", Where::nvme, Where::none, true},
    {"both_cpu", Where::cpu, Where::cpu, false},  // the seed's config
    {"no_offload_secondary_on_host", Where::none, Where::none, true},
};

INSTANTIATE_TEST_SUITE_P(Engine, HpzOffload, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace

// The seed's DeepSpeed config (configs/llama-3-8b-stage3.json, read unchanged) drives the engine on a tiny
// Llama-shaped model once its "auto" values are resolved from the model: stage 3, bf16, overlap_comm,
// buckets of hidden^2, persistence of 10 * hidden, two micro-steps per step. The engine's byte counters
// match the dry-run memory plan of the same model and config.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/engine_world.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"

using namespace zero3;

namespace {

std::string source_dir() {
  const char* dir = std::getenv("ZERO3_SOURCE_DIR");
  return dir ? dir : ".";
}

int64_t plan_bytes(const MemoryPlan& plan, MemoryCategory category, const std::string& what_prefix) {
  int64_t bytes = 0;
  for (const MemoryPlanEntry& e : plan.entries) {
    if (e.category == category && e.what.rfind(what_prefix, 0) == 0) bytes += e.bytes;
  }
  return bytes;
}

}  // namespace

TEST(EngineLlamaConfig, TheSeedConfigDrivesATinyLlama) {
  Config config = load_config(source_dir() + "/configs/llama-3-8b-stage3.json");
  const int64_t hidden = 48;
  ResolveInputs in;
  in.world_size = 1;
  in.hidden_size = hidden;
  in.micro_batch = 2;
  in.grad_accum = 2;
  in.precision = DType::bf16;
  in.max_grad_norm = 1.0;
  resolve(config, in);
  ASSERT_EQ(config.zero.stage, 3);
  ASSERT_EQ(config.zero.reduce_bucket_size, hidden * hidden);
  ASSERT_EQ(config.zero.param_persistence_threshold, 10 * hidden);

  LlamaDims dims;
  dims.hidden_size = hidden;
  dims.intermediate_size = 128;
  dims.num_hidden_layers = 2;
  dims.num_attention_heads = 4;
  dims.num_key_value_heads = 2;
  dims.vocab_size = 96;
  ModelDesc model = llama_model_desc(dims, "tiny-llama");

  CommOptions o;
  o.backend = "local";
  auto comm = std::shared_ptr<Communicator>(make_communicator(o, LaunchInfo{}, nullptr));
  auto device = make_cpu_device();
  Engine engine(zero3::testing::resolved_for(config, *comm), comm, *device);
  std::vector<UnitId> units;
  for (const UnitDesc& u : model.units) {
    UnitId id = engine.add_unit(u.name);
    for (size_t p = 0; p < u.params.size(); ++p) {
      engine.add_param(id, {"p" + std::to_string(p), u.params[p], ParamInit::normal(0.02)});
    }
    units.push_back(id);
  }
  engine.materialize();
  EXPECT_EQ(engine.compute_dtype(), DType::bf16);
  EXPECT_EQ(engine.gradient_accumulation_steps(), 2);

  // Persistence follows 10 * hidden: only units that small stay gathered.
  for (UnitId u : units)
    EXPECT_EQ(engine.unit(u).persistent, engine.unit(u).numel <= 10 * hidden) << engine.unit(u).name;

  // The byte counters at rest agree with the plan's entries for the same things.
  MemoryPlanOptions po;
  MemoryPlan plan = plan_memory(model, config, po);
  MemoryStats mem = engine.memory();
  EXPECT_EQ(mem.master, plan.rank_bytes(MemoryCategory::master));
  EXPECT_EQ(mem.optimizer_state, plan.rank_bytes(MemoryCategory::optimizer_state));
  EXPECT_EQ(mem.params, plan_bytes(plan, MemoryCategory::params, "parameter slices") +
                            plan_bytes(plan, MemoryCategory::params, "persistent"));

  // Two micro-steps per optimizer step; the second prefetches along the first's order.
  for (int micro = 0; micro < 4; ++micro) {
    if (micro == 2) engine.reset_schedule_stats();
    for (UnitId u : units) {
      auto s = engine.forward_scope(u);
      EXPECT_EQ(s.flat_params().dtype, DType::bf16);
    }
    for (auto it = units.rbegin(); it != units.rend(); ++it) {
      auto s = engine.backward_scope(*it);
      TensorView g = s.flat_grads();
      ASSERT_EQ(g.dtype, DType::f32);
      for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 1e-3f * static_cast<float>(i % 7);
    }
    StepResult r = engine.step();
    EXPECT_EQ(r.boundary, micro % 2 == 1);
    if (r.boundary) {
      EXPECT_TRUE(r.applied);
    }
  }
  ScheduleStats s = engine.schedule_stats();
  EXPECT_GT(s.prefetches, 0);
  EXPECT_GT(s.prefetch_hits, 0);
  EXPECT_LE(engine.memory().peak_total, plan.rank_bytes());
}

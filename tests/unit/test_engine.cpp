// The engine on one rank (the local communicator): declaration rules, initialisation, views, accumulation
// boundaries, equivalence with the reference for every stage and precision, overflow skipping, fp16 loss
// scaling and the memory each stage holds. Several ranks: tests/dist/test_equivalence*.cpp and
// tests/dist/test_engine*.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <limits>

#include "kernels/philox_init.hpp"
#include "offload/swap_file.hpp"
#include "support/engine_world.hpp"
#include "support/forwarding_comm.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/reference_model.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

std::shared_ptr<Communicator> local_comm() {
  CommOptions o;
  o.backend = "local";
  o.timeout = std::chrono::seconds(30);
  return make_communicator(o, LaunchInfo{}, nullptr);
}

struct Fixture {
  std::unique_ptr<Device> device = make_cpu_device();
  std::shared_ptr<Communicator> comm = local_comm();
};

}  // namespace

TEST(Engine, DeclarationErrorsNameTheThing) {
  Fixture f;
  Engine e(resolved_for(equivalence_config(3), *f.comm), f.comm, *f.device);
  UnitId u = e.add_unit("layer");
  EXPECT_THROW(e.add_unit("layer"), InvalidArgument);
  EXPECT_THROW(e.add_unit("a/b"), InvalidArgument);
  e.add_param(u, {"w", {3, 4}, ParamInit::ones()});
  try {
    e.add_param(u, {"w", {2}});
    FAIL();
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("layer.w"), std::string::npos) << err.what();
  }
  try {
    e.add_param(u, {"z", {3, 0}});
    FAIL();
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("[3, 0]"), std::string::npos) << err.what();
  }
  try {
    e.add_param(u, {"h", {2}, ParamInit::zeros(), DType::bf16});
    FAIL();
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("unit of its own"), std::string::npos) << err.what();
  }
  EXPECT_THROW(e.forward_scope(u), InvalidArgument);  // before materialize
  e.materialize();
  EXPECT_THROW(e.add_param(u, {"late", {2}}), InvalidArgument);
  EXPECT_THROW(e.forward_scope(UnitId{7}), InvalidArgument);
  EXPECT_EQ(e.param_id(u, "w"), *e.find_param("layer.w"));
  EXPECT_THROW(e.param_id(u, "nope"), InvalidArgument);
}

// A host communicator that reports itself as nccl on CUDA device `cuda_device`.
class NcclNamedComm final : public ForwardingComm {
 public:
  explicit NcclNamedComm(std::shared_ptr<Communicator> inner, int cuda_device = -1)
      : ForwardingComm(std::move(inner)), cuda_device_(cuda_device) {}
  const char* backend() const override { return "nccl"; }
  int cuda_device() const override { return cuda_device_; }
  bool checks_collectives() const override { return false; }  // as NCCL

 private:
  int cuda_device_;
};

TEST(Engine, CpuDeviceRefusesNccl) {
  Fixture f;
  try {
    Engine e(resolved_for(equivalence_config(3), *f.comm), std::make_shared<NcclNamedComm>(f.comm), *f.device);
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& err) {
    EXPECT_NE(std::string(err.what()).find("nccl works on GPU memory only"), std::string::npos) << err.what();
  }
}

// The communicator's GPU (NCCL picks the launcher's local rank) and the engine's device must be one GPU.
TEST(Engine, NcclOnAnotherGpuThanTheDeviceIsRefused) {
  Fixture f;
  StreamPathDevice gpu;  // cuda:0 to the engine
  try {
    Engine e(resolved_for(equivalence_config(3), *f.comm), std::make_shared<NcclNamedComm>(f.comm, 1), gpu);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("runs on cuda:1"), std::string::npos) << what;
    EXPECT_NE(what.find("stream-path test device"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(
      Engine(resolved_for(equivalence_config(3), *f.comm), std::make_shared<NcclNamedComm>(f.comm, 0), gpu));
}

// The engine trains only a config resolve() has seen, for its world size: skipping resolve() would leave "auto"
// values unset and the batch sizes unchecked against the world size.
TEST(Engine, AConfigResolveHasNotSeenIsAConfigErrorNamingWhatIsMissing) {
  Fixture f;
  auto error_of = [&](const Config& c) -> std::string {
    try {
      Engine e(c, f.comm, *f.device);
    } catch (const ConfigError& err) {
      return err.what();
    }
    return "no error";
  };
  auto has = [](const std::string& what, const char* part) { return what.find(part) != std::string::npos; };

  // Read from a file and never resolved: every pending "auto" key and every batch size not inferred is named.
  Config read = parse_config(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                 "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})",
                             "ds_config.json");
  std::string what = error_of(read);
  EXPECT_TRUE(has(what, "(from ds_config.json) was never resolved")) << what;
  EXPECT_TRUE(has(what,
                  "still \"auto\": train_batch_size, train_micro_batch_size_per_gpu, "
                  "zero_optimization.reduce_bucket_size"))
      << what;
  EXPECT_TRUE(has(what,
                  "batch sizes not inferred: train_batch_size, train_micro_batch_size_per_gpu, "
                  "gradient_accumulation_steps"))
      << what;
  EXPECT_TRUE(has(what, "zero3::resolve(config, {.world_size = comm->size()")) << what;

  // Built in code with nothing "auto": train_batch_size is what resolve() would infer.
  what = error_of(equivalence_config(3));
  EXPECT_TRUE(has(what, "(built in the program) was never resolved; batch sizes not inferred: train_batch_size."))
      << what;

  // Resolved for 2 ranks, used on 1: the batch layout does not fit.
  Config two = equivalence_config(3);
  ResolveInputs in;
  in.world_size = 2;
  resolve(two, in);
  what = error_of(two);
  EXPECT_TRUE(has(what,
                  "train_batch_size: 12 is not train_micro_batch_size_per_gpu 3 x gradient_accumulation_steps 2 "
                  "x the communicator's world size 1 = 6"))
      << what;

  // Resolved for this world, then a field the engine reads set back to "auto", or a stage out of range.
  Config c = resolved_for(equivalence_config(3), *f.comm);
  EXPECT_NO_THROW(Engine(c, f.comm, *f.device));
  c.zero.reduce_bucket_size.reset();
  EXPECT_TRUE(has(error_of(c), "zero_optimization.reduce_bucket_size: is still \"auto\"")) << error_of(c);
  c = resolved_for(equivalence_config(3), *f.comm);
  c.zero.stage = 5;
  EXPECT_TRUE(has(error_of(c), "zero_optimization.stage: 5")) << error_of(c);
}

TEST(Engine, InitialisesFromPhiloxAndReaders) {
  Fixture f;
  Config c = equivalence_config(3);
  Engine e(resolved_for(c, *f.comm), f.comm, *f.device);
  UnitId u = e.add_unit("u");
  e.add_param(u, {"n", {5, 7}, ParamInit::normal(0.5, 0.1)});
  e.add_param(u, {"c", {3}, ParamInit::constant(-2.5)});
  std::vector<std::pair<int64_t, int64_t>> asked;
  e.add_param(u, {"r", {11}, ParamInit::from_reader([&](int64_t b, int64_t end, float* out) {
                    asked.emplace_back(b, end);
                    for (int64_t i = b; i < end; ++i) out[i - b] = static_cast<float>(i) * 0.5f;
                  })});
  e.materialize();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(int64_t{0}, int64_t{11}));
  std::vector<float> flat(static_cast<size_t>(e.unit(u).numel));
  e.gather_master_params(u, flat.data());
  FillSpec normal;
  normal.kind = FillKind::normal;
  normal.mean = 0.1;
  normal.stddev = 0.5;
  for (int64_t i = 0; i < 35; ++i) {
    EXPECT_EQ(flat[i], philox_fill_value(normal, c.zero3.seed, philox_stream_id("u.n"), i)) << i;
  }
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(flat[35 + i], -2.5f);
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ(flat[38 + i], 0.5f * i);
  // The parameter views in a scope show the same values.
  auto s = e.forward_scope(u);
  TensorView r = s.param("r");
  ASSERT_EQ(r.numel, 11);
  ASSERT_EQ(r.shape.size(), 1u);
  EXPECT_EQ(r.as<float>()[10], 5.0f);
  EXPECT_THROW(r.as<uint16_t>(), InvalidArgument);
  EXPECT_THROW(s.grad("r"), InvalidArgument);  // a forward scope has no gradients
}

TEST(Engine, AccumulationBoundariesFollowTheConfig) {
  Fixture f;
  Config c = equivalence_config(2);
  c.gradient_accumulation_steps = 3;
  Engine e(resolved_for(c, *f.comm), f.comm, *f.device);
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  EXPECT_EQ(e.gradient_accumulation_steps(), 3);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(e.is_gradient_accumulation_boundary(), i % 3 == 2) << i;
    mlp_micro_step(e, units, d, make_batch(d, 1, i, 2));
    StepResult r = e.step();
    EXPECT_EQ(r.boundary, i % 3 == 2);
    EXPECT_EQ(r.applied, i % 3 == 2);
    EXPECT_EQ(r.micro_step, i + 1);
  }
  EXPECT_EQ(e.global_steps(), 2);
}

TEST(Engine, StepRefusesOpenScopes) {
  Fixture f;
  Engine e(resolved_for(equivalence_config(3), *f.comm), f.comm, *f.device);
  MlpDims d;
  MlpUnits units = declare_mlp(e, d);
  e.materialize();
  auto s = e.forward_scope(units.fc2);
  try {
    e.step();
    FAIL();
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("'fc2'"), std::string::npos) << err.what();
  }
}

class EngineEquivalence1 : public ::testing::TestWithParam<int> {};

TEST_P(EngineEquivalence1, MatchesTheReferenceInFp32) {
  Fixture f;
  const int stage = GetParam();
  Config c = equivalence_config(stage);
  TrainPlan plan;
  plan.steps = 10;
  Engine e(resolved_for(c, *f.comm), f.comm, *f.device);
  MlpUnits units = declare_mlp(e, plan.dims);
  e.materialize();
  EngineRun run = train_mlp(e, units, plan);
  ReferenceRun ref = run_reference(c, plan);
  ASSERT_EQ(run.losses.size(), 20u);
  bool clipped = false;
  for (int64_t t = 0; t < plan.steps; ++t) {
    for (int64_t k = 0; k < 2; ++k) {
      double want = ref.losses[t][k][0];
      EXPECT_NEAR(run.losses[t * 2 + k], want, 1e-5 * std::fabs(want)) << "step " << t << " micro " << k;
    }
    const StepResult& r = run.steps[t * 2 + 1];
    EXPECT_TRUE(r.applied);
    EXPECT_NEAR(r.grad_norm, ref.grad_norms[t], 1e-5 * ref.grad_norms[t]) << t;
    EXPECT_NEAR(r.lr, ref.lrs[t], 1e-9) << t;
    clipped |= r.clip_coef < 1.0;
  }
  EXPECT_TRUE(clipped) << "the run should exercise gradient clipping";
  std::string worst;
  double err = max_relative_error(run.params, ref.params, &worst);
  EXPECT_LT(err, 1e-5) << worst;
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineEquivalence1, ::testing::Values(0, 1, 2, 3));

// Bytes per category at rest and inside scopes, for the MLP (numel 518 + 37 + 1102 + 210 = 1867) on one rank.
TEST(Engine, MemoryByCategoryFollowsTheStage) {
  Fixture f;
  const int64_t n = 1867;
  struct Want {
    int stage;
    bool bf16;
    int64_t params, master, grads, optimizer;
  };
  const Want wants[] = {
      {0, false, n * 4, 0, n * 4, n * 8},              // fp32 parameters are the master
      {2, false, n * 4, 0, n * 4, n * 8},              // one rank: the slice is everything
      {3, false, n * 4 + 37 * 4, 0, n * 4, n * 8},     // master slices + the persistent "norm" unit gathered
      {3, true, n * 2 + 37 * 2, n * 4, n * 4, n * 8},  // bf16 slices + fp32 master
      {1, true, n * 2, n * 4, n * 4, n * 8},           // bf16 full parameters + fp32 master
  };
  for (const Want& w : wants) {
    Config c = equivalence_config(w.stage);
    c.bf16.enabled = w.bf16;
    Engine e(resolved_for(c, *f.comm), f.comm, *f.device);
    MlpUnits units = declare_mlp(e, MlpDims{});
    e.materialize();
    MemoryStats m = e.memory();
    SCOPED_TRACE("stage " + std::to_string(w.stage) + (w.bf16 ? " bf16" : " fp32"));
    EXPECT_EQ(m.params, w.params);
    EXPECT_EQ(m.master, w.master);
    EXPECT_EQ(m.grads, w.grads);
    EXPECT_EQ(m.optimizer_state, w.optimizer);
    EXPECT_EQ(m.buffers, 0) << "buckets are allocated at the first reduction";
    const size_t es = w.bf16 ? 2 : 4;
    {
      auto s = e.backward_scope(units.fc2);
      EXPECT_EQ(e.memory().grads, w.grads + 1102 * 4) << "an open backward scope holds the unit's gradient buffer";
      if (w.stage == 3) {
        EXPECT_EQ(e.memory().gathered, static_cast<int64_t>((1102 + 37) * es));
      }
    }
    EXPECT_EQ(e.memory().grads, w.grads);
    if (w.stage == 3) {
      EXPECT_EQ(e.memory().gathered, static_cast<int64_t>(37 * es)) << "released on exit (no trace yet)";
      EXPECT_EQ(e.memory().peak_gathered, static_cast<int64_t>((1102 + 37) * es));
    }
  }
}

// An error inside a collective call that is not a communication error (here the optimizer's swap file cut
// under the engine, so the step fails with some tiles updated) also leaves the engine failed: the next calls
// rethrow it instead of training on half-updated state or issuing collectives the other ranks are not at.
TEST(Engine, SwapFailureInTheStepFailsTheEngine) {
  Fixture f;
  RankTempDir dir;
  Config c = equivalence_config(3);
  c.zero.offload_optimizer.device = OffloadDevice::nvme;
  c.zero.offload_optimizer.nvme_path = dir.path();
  Engine e(resolved_for(c, *f.comm), f.comm, *f.device);
  const MlpDims dims;
  const MlpUnits units = declare_mlp(e, dims);
  e.materialize();
  TrainPlan plan;
  plan.steps = 1;
  train_mlp(e, units, plan);
  const std::string swap = offload::swap_file_path(dir.path(), "optimizer", 0);
  ASSERT_EQ(::truncate(swap.c_str(), 0), 0);
  std::string msg;
  for (int64_t m = 0; m < e.gradient_accumulation_steps() && msg.empty(); ++m) {
    mlp_micro_step(e, units, dims, make_batch(dims, 3, m, plan.micro_batch));
    try {
      e.step();
    } catch (const IoError& err) {
      msg = err.what();
    }
  }
  ASSERT_NE(msg, "") << "expected an IoError from the step";
  EXPECT_NE(msg.find(swap), std::string::npos) << msg;
  try {
    UnitScope s = e.forward_scope(units.fc1);
    FAIL() << "the engine should be failed";
  } catch (const IoError& err) {
    EXPECT_EQ(std::string(err.what()), msg);
  }
}

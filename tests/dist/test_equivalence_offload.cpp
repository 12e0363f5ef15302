// The equivalence test with the offload tiers on the cpu device: optimizer offload to cpu and to nvme (a swap
// file under /tmp, streamed through the Swapper at every step), parameter offload to cpu and, at stage 3 with
// bf16, to nvme, at stages 1-3 and in fp32 and bf16. Each run is compared with the same engine without offload, bit for
// bit (the step runs the same CPU Adam kernel on the same values, only the place the state lives changes), and with the
// reference model within the bounds of test_equivalence_options.cpp. A checkpoint saved with NVMe offload resumes
// bit-identically, and the swap files are gone after the engine.
// zero3-test-ranks: 1 2 3
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <ostream>
#include <string>

#include "offload/swap_file.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/reference_model.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::testing;

namespace {

enum class Offload { optimizer_cpu, optimizer_nvme, param_cpu, param_nvme, both_nvme };

struct Variant {
  std::string name;
  int stage;
  Offload offload;
  bool bf16;
  int64_t sub_group_size;
  double tolerance;  // against the reference model
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

void apply_offload(Config& c, Offload o, const std::string& dir) {
  switch (o) {
    case Offload::optimizer_cpu:
      c.zero.offload_optimizer.device = OffloadDevice::cpu;
      break;
    case Offload::optimizer_nvme:
      c.zero.offload_optimizer.device = OffloadDevice::nvme;
      c.zero.offload_optimizer.nvme_path = dir;
      c.zero.offload_optimizer.pipeline_read = true;
      c.zero.offload_optimizer.pipeline_write = true;
      c.zero.offload_optimizer.buffer_count = 4;
      break;
    case Offload::param_cpu:
      c.zero.offload_param.device = OffloadDevice::cpu;
      break;
    case Offload::param_nvme:
      c.zero.offload_param.device = OffloadDevice::nvme;
      c.zero.offload_param.nvme_path = dir;
      c.zero.offload_param.buffer_size = 100'000;
      break;
    case Offload::both_nvme:
      apply_offload(c, Offload::optimizer_nvme, dir);
      apply_offload(c, Offload::param_nvme, dir);
      break;
  }
}

class OffloadEquivalence : public ::testing::TestWithParam<Variant> {};

TEST_P(OffloadEquivalence, BitIdenticalToNoOffloadAndCloseToTheReference) {
  const Variant& v = GetParam();
  auto comm = engine_world();
  RankTempDir dir;
  Config base = equivalence_config(v.stage);
  base.bf16.enabled = v.bf16;
  base.communication_data_type = DType::f32;  // the reference's exact sums: the bf16 bound below
  base.zero.sub_group_size = v.sub_group_size;
  Config off = base;
  apply_offload(off, v.offload, dir.path());
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 6;

  EngineRun want;
  {
    Engine engine(resolved_for(base, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    want = train_mlp(engine, units, plan);
  }
  EngineRun got;
  const std::string swap = offload::swap_file_path(dir.path(), "optimizer", comm->rank());
  const std::string param_swap = offload::swap_file_path(dir.path(), "param", comm->rank());
  const bool opt_nvme = v.offload == Offload::optimizer_nvme || v.offload == Offload::both_nvme;
  const bool param_nvme = v.offload == Offload::param_nvme || v.offload == Offload::both_nvme;
  {
    Engine engine(resolved_for(off, *comm), comm, cpu_device());
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    EXPECT_EQ(std::filesystem::exists(param_swap), param_nvme) << param_swap;
    if (opt_nvme) {
      EXPECT_TRUE(std::filesystem::exists(swap)) << swap;
      // The Adam moments no longer take host memory; only fp32 parameters keep a resident master copy.
      EXPECT_EQ(engine.memory().optimizer_state, 0);
      if (v.bf16) {
        EXPECT_EQ(engine.memory().master, 0);
      }
    }
    got = train_mlp(engine, units, plan);
  }
  EXPECT_FALSE(std::filesystem::exists(swap)) << "the engine should remove its swap file";
  EXPECT_FALSE(std::filesystem::exists(param_swap)) << "the engine should remove its swap file";

  expect_same_run(got, want);

  ReferenceRun ref = run_reference(base, plan);
  std::string worst;
  double err = max_relative_error(got.params, ref.params, &worst);
  EXPECT_LE(err, v.tolerance) << "largest weight difference at " << worst;
}

// bf16 bound: test_equivalence_options.cpp explains 5e-3.
const Variant kVariants[] = {
    {"stage1_optimizer_cpu", 1, Offload::optimizer_cpu, false, 1'000'000'000, 1e-5},
    {"stage3_optimizer_cpu_bf16_tiles", 3, Offload::optimizer_cpu, true, 17, 5e-3},
    {"stage2_optimizer_nvme", 2, Offload::optimizer_nvme, false, 1'000'000'000, 1e-5},
    {"stage1_optimizer_nvme_tiles", 1, Offload::optimizer_nvme, false, 100, 1e-5},
    {"stage2_optimizer_nvme_bf16", 2, Offload::optimizer_nvme, true, 64, 5e-3},
    {"stage3_optimizer_nvme", 3, Offload::optimizer_nvme, false, 33, 1e-5},
    {"stage3_optimizer_nvme_bf16", 3, Offload::optimizer_nvme, true, 1'000'000'000, 5e-3},
    {"stage3_param_cpu", 3, Offload::param_cpu, false, 1'000'000'000, 1e-5},
    {"stage3_param_cpu_bf16", 3, Offload::param_cpu, true, 50, 5e-3},
    {"stage3_param_nvme_bf16", 3, Offload::param_nvme, true, 1'000'000'000, 5e-3},
    {"stage3_both_nvme_bf16_tiles", 3, Offload::both_nvme, true, 23, 5e-3},
    // sub_group_size 0 as the reader gives it: the largest int64, one tile per unit's owned range.
    {"stage3_both_nvme_bf16_whole_units", 3, Offload::both_nvme, true, std::numeric_limits<int64_t>::max(), 5e-3},
    {"stage3_optimizer_cpu_whole_units", 3, Offload::optimizer_cpu, false, std::numeric_limits<int64_t>::max(), 1e-5},
};

INSTANTIATE_TEST_SUITE_P(Offload, OffloadEquivalence, ::testing::ValuesIn(kVariants), variant_name);

// A checkpoint saved from a run with NVMe optimizer offload (local_shard reads the state from the swap file),
// loaded into a fresh engine with NVMe offload (refresh_params writes it back), goes on bit-identically.
TEST(OffloadCheckpoint, NvmeResumeIsBitIdentical) {
  auto comm = engine_world();
  RankTempDir swap_dir;
  SharedTempDir ckpt(*comm, "zero3-offload-ckpt");
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Config c = equivalence_config(3);
    c.bf16.enabled = bf16;
    c.zero.sub_group_size = 40;
    // bf16 also swaps the parameter slices (refresh_params rebuilds them in the swap).
    apply_offload(c, bf16 ? Offload::both_nvme : Offload::optimizer_nvme, swap_dir.path());
    TrainPlan plan;
    plan.world = comm->size();
    const std::string tag = bf16 ? "bf16" : "fp32";

    MlpEngine whole = make_mlp_engine(c, comm, cpu_device(), plan.dims);
    train_steps(*whole.engine, whole.units, plan, 0, 3);
    save_checkpoint(*whole.engine, ckpt.path(), tag);
    std::vector<double> want = train_steps(*whole.engine, whole.units, plan, 3, 3);
    auto want_state = gather_all_state(*whole.engine);
    whole.engine.reset();

    MlpEngine resumed = make_mlp_engine(c, comm, cpu_device(), plan.dims);
    load_checkpoint(*resumed.engine, ckpt.path(), tag);
    std::vector<double> got = train_steps(*resumed.engine, resumed.units, plan, 3, 3);
    EXPECT_EQ(got, want);
    EXPECT_EQ(first_bit_difference(gather_all_state(*resumed.engine), want_state), "");
  }
}

// Not built yet: parameter offload to NVMe with fp32 compute (the slice is the optimizer's master) is refused
// before anything is allocated, naming the key.
TEST(OffloadConfigErrors, ParamNvmeIsUnsupportedAndNamed) {
  auto comm = engine_world();
  RankTempDir dir;
  Config c = equivalence_config(3);
  c.zero.offload_param.device = OffloadDevice::nvme;
  c.zero.offload_param.nvme_path = dir.path();
  try {
    Engine engine(resolved_for(c, *comm), comm, cpu_device());
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param"), std::string::npos) << e.what();
  }
}

// Optimizer offload at stage 0 is refused (as DeepSpeed does), naming the key.
TEST(OffloadConfigErrors, OptimizerOffloadNeedsStageOne) {
  auto comm = engine_world();
  Config c = equivalence_config(0);
  c.zero.offload_optimizer.device = OffloadDevice::cpu;
  try {
    Engine engine(resolved_for(c, *comm), comm, cpu_device());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.device"), std::string::npos) << e.what();
  }
}

// A missing nvme_path directory is an IoError at materialize, before any step, naming the directory.
TEST(OffloadConfigErrors, MissingSwapDirectoryFailsAtMaterialize) {
  auto comm = engine_world();
  Config c = equivalence_config(2);
  apply_offload(c, Offload::optimizer_nvme, "/tmp/zero3-no-such-dir-for-offload/x");
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  declare_mlp(engine, MlpDims{});
  try {
    engine.materialize();
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/tmp/zero3-no-such-dir-for-offload/x"), std::string::npos) << e.what();
  }
}

}  // namespace

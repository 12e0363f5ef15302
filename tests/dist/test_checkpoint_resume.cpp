// Save at step k on N ranks, resume in a fresh engine on the same N ranks: every following loss, the final
// weights and the whole Adam state are bit for bit those of a run that never stopped, at ZeRO stages 0-3, in
// bf16 and fp16 (with its loss scaler) and with the optimizer offloaded to the CPU. The checkpoint written by
// N ranks also consolidates into Hugging Face safetensors equal to the gathered model, and save_16bit_model
// writes the gathered weights in bf16.
// zero3-test-ranks: 2 3
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "checkpoint/manifest.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;

struct Variant {
  std::string name;
  int stage;
  std::function<void(Config&)> change;
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }

class Resume : public ::testing::TestWithParam<Variant> {};

TEST_P(Resume, FollowingStepsAreBitIdentical) {
  const Variant& v = GetParam();
  auto comm = engine_world();
  SharedTempDir dir(*comm, "zero3-ckpt-resume");
  Config c = equivalence_config(v.stage);
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  constexpr int64_t kFirst = 3, kRest = 3;

  MlpEngine straight = make_mlp_engine(c, comm, cpu_device());
  const std::vector<double> want = train_steps(*straight.engine, straight.units, plan, 0, kFirst + kRest);
  const auto want_state = gather_all_state(*straight.engine);

  std::vector<double> got;
  {
    MlpEngine first = make_mlp_engine(c, comm, cpu_device());
    got = train_steps(*first.engine, first.units, plan, 0, kFirst);
    const SavedCheckpoint saved =
        save_checkpoint(*first.engine, dir.path(), "step3", {{"next_step", std::to_string(kFirst)}});
    // Stage 0 replicates everything: rank 0 alone writes it. Otherwise every rank writes its slice.
    EXPECT_EQ(saved.files, v.stage == 0 ? 1 : comm->size());
    EXPECT_EQ(saved.rank_bytes > 0, v.stage != 0 || comm->rank() == 0);
  }
  MlpEngine second = make_mlp_engine(c, comm, cpu_device());
  const LoadedCheckpoint loaded = load_checkpoint(*second.engine, dir.path());
  EXPECT_FALSE(loaded.resharded);
  EXPECT_EQ(loaded.saved_world_size, comm->size());
  const int64_t next = std::stoll(loaded.extras.at("next_step"));
  const std::vector<double> rest = train_steps(*second.engine, second.units, plan, next, kRest);
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i], want[i]) << "rank " << comm->rank() << ", micro-step " << i;
  EXPECT_EQ(second.engine->training_state().global_steps, straight.engine->training_state().global_steps);
  EXPECT_EQ(second.engine->training_state().skipped_steps, straight.engine->training_state().skipped_steps);
  EXPECT_EQ(second.engine->loss_scale(), straight.engine->loss_scale());
  EXPECT_EQ(first_bit_difference(gather_all_state(*second.engine), want_state), "");
}

const Variant kVariants[] = {
    {"stage0", 0, nullptr},
    {"stage1", 1, nullptr},
    {"stage2", 2, nullptr},
    {"stage3", 3, nullptr},
    {"stage3_bf16", 3, [](Config& c) { c.bf16.enabled = true; }},
    {"stage2_fp16_scaler", 2,
     [](Config& c) {
       c.fp16.enabled = true;
       c.fp16.initial_scale_power = 17;  // overflows at first: skipped steps and a lowered scale to restore
       c.grad_accum_dtype = DType::f16;
     }},
    {"stage3_offload_cpu", 3, [](Config& c) { c.zero.offload_optimizer.device = OffloadDevice::cpu; }},
};

INSTANTIATE_TEST_SUITE_P(Checkpoint, Resume, ::testing::ValuesIn(kVariants), variant_name);

TEST(CheckpointExport, ConsolidatedAndSixteenBitFilesEqualTheGatheredModel) {
  auto comm = engine_world();
  SharedTempDir dir(*comm, "zero3-ckpt-export");
  TrainPlan plan;
  plan.world = comm->size();
  MlpEngine m = make_mlp_engine(equivalence_config(3), comm, cpu_device());
  train_steps(*m.engine, m.units, plan, 0, 2);
  save_checkpoint(*m.engine, dir.path(), "s2");
  const auto want = gather_params(*m.engine);
  const ExportedModel sixteen = save_16bit_model(*m.engine, dir.path() / "bf16");
  EXPECT_EQ(sixteen.tensors, 7);
  EXPECT_GT(sixteen.bytes, 0u);
  comm->barrier();
  if (comm->rank() == 0) {
    ExportOptions o;
    o.dtype = DType::f32;
    o.max_shard_bytes = 3000;
    const ExportedModel out = consolidate_checkpoint(dir.path(), "latest", dir.path() / "hf", o);
    EXPECT_GT(out.files.size(), 2u);
    safetensors::ShardedSafetensorsReader hf(dir.path() / "hf");
    safetensors::SafetensorsReader bf16(dir.path() / "bf16" / "model.safetensors");
    for (const auto& [name, values] : want) {
      std::vector<float> got(values.size());
      hf.read_as_f32(name, 0, static_cast<int64_t>(values.size()), got.data());
      EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size() * sizeof(float)), 0) << name;
      std::vector<uint16_t> half(values.size());
      bf16.read_range(name, 0, static_cast<int64_t>(values.size()), half.data());
      for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(half[i], f32_to_bf16(values[i])) << name << "[" << i << "]";
    }
  }
}

// A checkpoint of N ranks whose manifest was edited by hand, loaded as a resume would load it: every rank refuses
// it, naming the manifest or the file and what does not fit, before the engine changes.
TEST(CheckpointTampering, EditedManifestsAreRefusedOnEveryRank) {
  auto comm = engine_world();
  ASSERT_GE(comm->size(), 2) << "needs two shard files";
  SharedTempDir dir(*comm, "zero3-ckpt-tamper");
  TrainPlan plan;
  plan.world = comm->size();
  MlpEngine m = make_mlp_engine(equivalence_config(3), comm, cpu_device());
  train_steps(*m.engine, m.units, plan, 0, 2);
  save_checkpoint(*m.engine, dir.path(), "s2");
  const fs::path ck = dir.path() / "s2";
  const std::string manifest = (ck / ckpt::kManifestName).string();
  const CheckpointInfo saved = read_checkpoint_info(dir.path(), "s2");
  MlpEngine fresh = make_mlp_engine(equivalence_config(3), comm, cpu_device());
  const auto before = gather_all_state(*fresh.engine);

  // Rank 0 edits, then every rank loads and must get a CheckpointError holding every one of `parts`.
  auto expect_refused = [&](const std::function<void(CheckpointInfo&)>& edit, const std::vector<std::string>& parts) {
    if (comm->rank() == 0) {
      CheckpointInfo info = saved;
      edit(info);
      std::ofstream(manifest, std::ios::trunc) << ckpt::manifest_to_json(info);
    }
    comm->barrier();
    try {
      load_checkpoint(*fresh.engine, dir.path(), "s2");
      ADD_FAILURE() << "rank " << comm->rank() << " loaded the edited checkpoint; expected " << parts[0];
    } catch (const CheckpointError& e) {
      for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    comm->barrier();
  };
  // The ranges of the first two files swapped: each unit is still covered exactly once.
  expect_refused([](CheckpointInfo& info) { std::swap(info.files[0].ranges, info.files[1].ranges); },
                 {manifest, "files[0] (rank-00000-of-", "swapped between files"});
  // One more rank than files.
  const std::string more = std::to_string(comm->size() + 1);
  expect_refused([](CheckpointInfo& info) { info.world_size += 1; },
                 {manifest, "world_size " + more + " at stage 3 means " + more + " shard file(s)"});
  // The two files exchanged on disk, with their sizes and checksums in the manifest: each file's header still says
  // which rank wrote it.
  if (comm->rank() == 0) {
    fs::rename(ck / saved.files[0].name, ck / "swap");
    fs::rename(ck / saved.files[1].name, ck / saved.files[0].name);
    fs::rename(ck / "swap", ck / saved.files[1].name);
  }
  expect_refused(
      [](CheckpointInfo& info) {
        std::swap(info.files[0].bytes, info.files[1].bytes);
        std::swap(info.files[0].crc32c, info.files[1].crc32c);
      },
      {"was written with rank '1'", "the manifest says '0'"});
  EXPECT_EQ(first_bit_difference(gather_all_state(*fresh.engine), before), "") << "a refused load changed the engine";
}

}  // namespace
}  // namespace zero3::testing

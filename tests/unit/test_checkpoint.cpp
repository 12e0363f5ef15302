// Checkpoints in one process (world of one, the local communicator): save and exact resume at every stage,
// the directory protocol (latest, replacing a tag, leftovers of interrupted saves), and every way a load must
// refuse a checkpoint before it touches the engine: a flipped byte, a truncated or missing file, a missing
// manifest, a checkpoint of another model.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "checkpoint/checkpoint_dir.hpp"
#include "checkpoint/manifest.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/memory_plan.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = std::make_unique<SharedTempDir>(*engine_world(), "zero3-ckpt-unit"); }
  void TearDown() override { dir_.reset(); }
  fs::path dir() const { return dir_->path(); }

  MlpEngine engine(int stage = 3, const MlpDims& dims = {}) {
    return make_mlp_engine(equivalence_config(stage), engine_world(), cpu_device(), dims);
  }

  std::unique_ptr<SharedTempDir> dir_;
  TrainPlan plan_;
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// Expects `fn` to throw CheckpointError with every one of `parts` in its message.
template <typename Fn>
void expect_checkpoint_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, ResumeIsBitIdenticalAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    MlpEngine straight = engine(stage);
    std::vector<double> want = train_steps(*straight.engine, straight.units, plan_, 0, 6);
    const auto want_state = gather_all_state(*straight.engine);

    MlpEngine first = engine(stage);
    std::vector<double> got = train_steps(*first.engine, first.units, plan_, 0, 3);
    const std::string tag = "stage" + std::to_string(stage);
    SavedCheckpoint saved = save_checkpoint(*first.engine, dir(), tag, {{"next_step", "3"}});
    EXPECT_EQ(saved.path, dir() / tag);
    EXPECT_EQ(saved.files, 1);
    EXPECT_EQ(saved.bytes, fs::file_size(dir() / tag / "rank-00000-of-00001.safetensors"));
    first.engine.reset();

    MlpEngine second = engine(stage);
    LoadedCheckpoint loaded = load_checkpoint(*second.engine, dir());
    EXPECT_EQ(loaded.tag, tag);
    EXPECT_EQ(loaded.extras.at("next_step"), "3");
    EXPECT_EQ(loaded.training_state.global_steps, 3);
    EXPECT_EQ(loaded.training_state.micro_steps, 6);
    EXPECT_FALSE(loaded.resharded);
    EXPECT_EQ(second.engine->global_steps(), 3);
    std::vector<double> rest = train_steps(*second.engine, second.units, plan_, 3, 3);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "micro-step " << i;
    EXPECT_EQ(first_bit_difference(gather_all_state(*second.engine), want_state), "");
  }
}

TEST_F(CheckpointTest, Fp16LossScalerStateComesBack) {
  Config c = equivalence_config(2);
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 17;  // fp16 gradients overflow at first: the scaler backs off, skips are counted
  c.grad_accum_dtype = DType::f16;
  MlpEngine straight = make_mlp_engine(c, engine_world(), cpu_device());
  std::vector<double> want = train_steps(*straight.engine, straight.units, plan_, 0, 6);
  MlpEngine first = make_mlp_engine(c, engine_world(), cpu_device());
  std::vector<double> got = train_steps(*first.engine, first.units, plan_, 0, 3);
  const TrainingState before = first.engine->training_state();
  ASSERT_GT(before.skipped_steps, 0) << "the run should skip steps while the loss scale comes down";
  save_checkpoint(*first.engine, dir(), "fp16");
  MlpEngine second = make_mlp_engine(c, engine_world(), cpu_device());
  LoadedCheckpoint loaded = load_checkpoint(*second.engine, dir(), "fp16");
  EXPECT_EQ(loaded.training_state.skipped_steps, before.skipped_steps);
  EXPECT_EQ(loaded.training_state.loss_scale, before.loss_scale);
  EXPECT_EQ(loaded.training_state.scaler_iter, before.scaler_iter);
  EXPECT_EQ(loaded.training_state.scaler_last_overflow_iter, before.scaler_last_overflow_iter);
  EXPECT_EQ(second.engine->loss_scale(), first.engine->loss_scale());
  std::vector<double> rest = train_steps(*second.engine, second.units, plan_, 3, 3);
  got.insert(got.end(), rest.begin(), rest.end());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "micro-step " << i;
  EXPECT_EQ(first_bit_difference(gather_params(*second.engine), gather_params(*straight.engine)), "");
}

TEST_F(CheckpointTest, LoadFromFp32WeightsFalseStartsTheMasterFromTheBf16Weights) {
  Config c = equivalence_config(3);
  c.bf16.enabled = true;
  MlpEngine m = make_mlp_engine(c, engine_world(), cpu_device());
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "bf");
  const auto saved = gather_all_state(*m.engine);
  c.zero.load_from_fp32_weights = false;
  MlpEngine r = make_mlp_engine(c, engine_world(), cpu_device());
  load_checkpoint(*r.engine, dir());
  const auto loaded = gather_all_state(*r.engine);
  int rounded = 0;
  for (const auto& [name, values] : saved) {
    const std::vector<float>& got = loaded.at(name);
    for (size_t i = 0; i < values.size(); ++i) {
      const bool master = name.ends_with(".master");
      const float want = master ? bf16_to_f32(f32_to_bf16(values[i])) : values[i];
      ASSERT_EQ(got[i], want) << name << "[" << i << "]";
      rounded += master && want != values[i];
    }
  }
  EXPECT_GT(rounded, 100) << "the fp32 master should differ from its bf16 rounding somewhere";
}

TEST_F(CheckpointTest, LatestFollowsEachSaveAndATagCanBeReplaced) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "a");
  EXPECT_EQ(resolve_checkpoint_tag(dir()), "a");
  train_steps(*m.engine, m.units, plan_, 1, 1);
  save_checkpoint(*m.engine, dir(), "b");
  EXPECT_EQ(resolve_checkpoint_tag(dir()), "b");
  EXPECT_EQ(list_checkpoints(dir()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(read_checkpoint_info(dir(), "a").training_state.global_steps, 1);
  // Saving "a" again replaces it, and makes it the latest.
  train_steps(*m.engine, m.units, plan_, 2, 1);
  const auto want = gather_params(*m.engine);
  save_checkpoint(*m.engine, dir(), "a");
  EXPECT_EQ(resolve_checkpoint_tag(dir()), "a");
  EXPECT_EQ(read_checkpoint_info(dir(), "a").training_state.global_steps, 3);
  MlpEngine fresh = engine();
  load_checkpoint(*fresh.engine, dir());
  EXPECT_EQ(first_bit_difference(gather_params(*fresh.engine), want), "");
  // Nothing but the two checkpoints and the pointer is left.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "latest"}));
}

TEST_F(CheckpointTest, ManifestDescribesTheRun) {
  MlpEngine m = engine(3);
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "s2", {{"epoch", "1"}, {"sampler", R"({"position": 24})"}});
  const CheckpointInfo info = verify_checkpoint(dir(), "s2");
  EXPECT_EQ(info.format_version, ckpt::kFormatVersion);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.stage, 3);
  EXPECT_EQ(info.training_state.global_steps, 2);
  EXPECT_EQ(info.training_state.applied_steps, 2);
  EXPECT_EQ(info.extras.at("sampler"), R"({"position": 24})");
  ASSERT_EQ(info.units.size(), 4u);
  EXPECT_EQ(info.units[0].name, "fc1");
  ASSERT_EQ(info.units[0].params.size(), 2u);
  EXPECT_EQ(info.units[0].params[0].full_name, "fc1.w");
  EXPECT_EQ(info.units[0].params[0].shape, (std::vector<int64_t>{37, 13}));
  EXPECT_EQ(info.units[0].params[1].offset, 37 * 13);
  EXPECT_EQ(info.parameter_count(), 37 * 13 + 37 + 37 + 29 * 37 + 29 + 7 * 29 + 7);
  ASSERT_EQ(info.files.size(), 1u);
  EXPECT_EQ(info.files[0].ranges.size(), 4u);
  EXPECT_NE(info.config_json.find("\"stage\": 3"), std::string::npos) << info.config_json;
  // The shard file is a plain safetensors file: the master weights of a unit are its parameters back to back.
  safetensors::SafetensorsReader shard(dir() / "s2" / info.files[0].name);
  std::vector<float> fc1(static_cast<size_t>(info.units[0].numel));
  shard.read_range("fc1.master", 0, info.units[0].numel, fc1.data());
  const auto params = gather_params(*m.engine);
  EXPECT_EQ(std::memcmp(fc1.data(), params.at("fc1.w").data(), 37 * 13 * sizeof(float)), 0);
}

TEST_F(CheckpointTest, FlippedByteIsCaughtBeforeTheEngineChanges) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "x");
  const fs::path file = dir() / "x" / "rank-00000-of-00001.safetensors";
  std::string bytes = read_text(file);
  bytes[bytes.size() - 100] ^= 0x10;  // inside fc2's or head's exp_avg_sq
  write_text(file, bytes);

  MlpEngine fresh = engine();
  train_steps(*fresh.engine, fresh.units, plan_, 0, 1);
  const auto before = gather_all_state(*fresh.engine);
  const TrainingState state_before = fresh.engine->training_state();
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir()); },
                          {file.string(), "CRC-32C mismatch", "corrupt"});
  EXPECT_EQ(first_bit_difference(gather_all_state(*fresh.engine), before), "") << "a failed load changed the engine";
  EXPECT_EQ(fresh.engine->training_state().global_steps, state_before.global_steps);
  expect_checkpoint_error([&] { verify_checkpoint(dir(), "x"); }, {"CRC-32C mismatch"});
  std::vector<FileCheck> checks = verify_checkpoint_files(read_checkpoint_info(dir(), "x"));
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_FALSE(checks[0].ok);
}

TEST_F(CheckpointTest, TruncatedAndMissingFilesAreNamed) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "t");
  const fs::path file = dir() / "t" / "rank-00000-of-00001.safetensors";
  const uint64_t size = fs::file_size(file);
  fs::resize_file(file, size - 7);
  MlpEngine fresh = engine();
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "t"); },
                          {file.string(), std::to_string(size - 7) + " bytes", std::to_string(size), "truncated"});
  fs::remove(file);
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "t"); }, {file.string(), "missing"});
  fs::remove(dir() / "t" / "manifest.json");
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "t"); }, {"manifest.json", "did not complete"});
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "nope"); }, {"no checkpoint 'nope'"});
}

// A manifest edited after the save (counters rewritten so that they still agree with each other, a file entry
// pointing at another save's shard) is refused naming the file: each shard file's header, under its CRC, records
// the tag, the rank, its ranges and the counters it was saved with.
TEST_F(CheckpointTest, AManifestRewrittenAfterTheSaveIsRefused) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "a");
  train_steps(*m.engine, m.units, plan_, 2, 1);
  save_checkpoint(*m.engine, dir(), "b");
  const fs::path manifest = dir() / "b" / "manifest.json";
  const fs::path file = dir() / "b" / "rank-00000-of-00001.safetensors";
  const std::string original = read_text(manifest);
  MlpEngine fresh = engine();

  CheckpointInfo info = ckpt::read_manifest(dir() / "b");
  const int64_t gas = m.engine->gradient_accumulation_steps();
  info.training_state.global_steps += 10;
  info.training_state.applied_steps += 10;
  info.training_state.micro_steps += 10 * gas;
  write_text(manifest, ckpt::manifest_to_json(info));
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "b"); },
                          {file.string(), "was saved at training_state.micro_steps " + std::to_string(3 * gas),
                           "the manifest says " + std::to_string(13 * gas), "restore_training_state"});
  expect_checkpoint_error([&] { verify_checkpoint(dir(), "b"); }, {"training_state.micro_steps"});

  // b's entry now describes a's file, copied over b's (size and CRC made to match).
  write_text(manifest, original);
  info = ckpt::read_manifest(dir() / "b");
  const CheckpointInfo a = ckpt::read_manifest(dir() / "a");
  fs::copy_file(dir() / "a" / file.filename(), file, fs::copy_options::overwrite_existing);
  info.files[0].bytes = a.files[0].bytes;
  info.files[0].crc32c = a.files[0].crc32c;
  write_text(manifest, ckpt::manifest_to_json(info));
  expect_checkpoint_error([&] { load_checkpoint(*fresh.engine, dir(), "b"); },
                          {file.string(), "was written with tag 'a'", "the manifest says 'b'", "another save"});
  EXPECT_EQ(fresh.engine->training_state().global_steps, 0) << "a refused load changed the engine";
}

// The program's own state: a value that is not a number is named with its file and key, not just "stoll".
TEST_F(CheckpointTest, ExtrasReadAsIntegersNameTheKey) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "e", {{"position", "123"}, {"epoch", "-4"}, {"seen", "12x"}, {"huge", "1e3"}});
  MlpEngine fresh = engine();
  const LoadedCheckpoint loaded = load_checkpoint(*fresh.engine, dir(), "e");
  EXPECT_EQ(loaded.extra_int("position"), 123);
  EXPECT_EQ(loaded.extra_int("epoch"), -4);
  const std::string manifest = (dir() / "e" / "manifest.json").string();
  expect_checkpoint_error([&] { loaded.extra_int("seen"); },
                          {manifest + ": extras.seen is '12x', expected a decimal integer"});
  expect_checkpoint_error([&] { loaded.extra_int("huge"); }, {"extras.huge is '1e3'"});
  expect_checkpoint_error([&] { loaded.extra_int("gone"); }, {manifest + ": extras.gone is missing"});
  LoadedCheckpoint big = loaded;
  big.extras["position"] = "99999999999999999999";
  expect_checkpoint_error([&] { big.extra_int("position"); }, {"fits 64 bits"});
}

// What llama3_train checks its --save-dir against: the size of one checkpoint as zero3::checkpoint_bytes (the
// memory plan's figure) estimates it from the shapes alone holds every file of a real save.
TEST_F(CheckpointTest, ASaveFitsTheEstimateOfItsSize) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  const SavedCheckpoint saved = save_checkpoint(*m.engine, dir(), "size");
  ModelDesc desc;
  for (size_t i = 0; i < m.engine->num_units(); ++i) {
    const UnitInfo& u = m.engine->unit(UnitId{static_cast<int32_t>(i)});
    UnitDesc d{u.name, {}};
    for (ParamId p : u.params) d.params.push_back(m.engine->param(p).shape);
    desc.units.push_back(d);
  }
  const uint64_t manifest = fs::file_size(dir() / "size" / "manifest.json");
  EXPECT_GE(saved.bytes, 12u * static_cast<uint64_t>(desc.numel()));  // the state itself
  EXPECT_GE(static_cast<uint64_t>(checkpoint_bytes(desc, 1)), saved.bytes + manifest);
}

// The start-up check of a directory a run will write into: created when missing, then a directory, writable and
// roomy enough, or a CheckpointError naming the path and the reason.
TEST(OutputDirectory, IsCreatedProbedAndLeftEmpty) {
  SharedTempDir tmp(*engine_world(), "zero3-outdir");
  const fs::path dir = tmp.path() / "runs" / "a";
  check_output_directory(dir, "--save-dir", 4096, "one checkpoint");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir)) << "the probe file was left behind";
  check_output_directory(dir, "--save-dir");  // again: it exists now
}

TEST(OutputDirectory, RefusesAFileAFullDiskAndAnEmptyPath) {
  SharedTempDir tmp(*engine_world(), "zero3-outdir");
  const fs::path file = tmp.path() / "ckpt";
  write_text(file, "not a directory");
  expect_checkpoint_error([&] { check_output_directory(file, "--save-dir"); },
                          {"--save-dir " + file.string() + ": is a regular file, not a directory"});
  expect_checkpoint_error([&] { check_output_directory(file / "sub", "--save-dir"); },
                          {"--save-dir " + (file / "sub").string() + ": cannot create it: Not a directory"});
  expect_checkpoint_error(
      [&] { check_output_directory(tmp.path(), "--save-dir", uint64_t{1} << 62, "one checkpoint"); },
      {"--save-dir " + tmp.path().string() + ": its file system has ",
       " available, but one checkpoint needs about 4611686018427387904 bytes"});
  expect_checkpoint_error([&] { check_output_directory("", "--consolidate-to"); },
                          {"--consolidate-to : is an empty path"});
}

// A read-only file system, as a read-only mount of the checkpoint volume gives it (permission bits would not stop
// root): a tmpfs mounted read-only in a mount namespace of a child process.
TEST(OutputDirectory, RefusesAReadOnlyFileSystem) {
  SharedTempDir tmp(*engine_world(), "zero3-outdir");
  const fs::path dir = tmp.path() / "ro";
  fs::create_directories(dir);
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    const int flags = ::geteuid() == 0 ? CLONE_NEWNS : CLONE_NEWUSER | CLONE_NEWNS;
    if (::unshare(flags) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("none", dir.c_str(), "tmpfs", MS_RDONLY, nullptr) != 0) {
      ::_exit(77);
    }
    std::string message = "accepted";
    try {
      check_output_directory(dir, "--save-dir");
    } catch (const CheckpointError& e) {
      message = e.what();
    }
    [[maybe_unused]] ssize_t n = ::write(out[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int ws = 0;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) GTEST_SKIP() << "no mount namespace here";
  EXPECT_EQ(message, "--save-dir " + dir.string() + ": cannot create a file in it: Read-only file system");
}

TEST_F(CheckpointTest, AnotherModelIsRefusedNamingTheFirstDifference) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "m");
  MlpDims wider;
  wider.h2 = 30;
  MlpEngine other = engine(3, wider);
  expect_checkpoint_error([&] { load_checkpoint(*other.engine, dir()); },
                          {"does not match the engine's model", "'fc2.w'", "[29, 37]", "[30, 37]"});
  // A model with an extra unit.
  auto extra =
      std::make_unique<Engine>(resolved_for(equivalence_config(3), *engine_world()), engine_world(), cpu_device());
  declare_mlp(*extra, {});
  extra->add_unit("lora", {{"a", {4, 4}, ParamInit::zeros()}});
  extra->materialize();
  expect_checkpoint_error([&] { load_checkpoint(*extra, dir()); }, {"4 units", "5", "'lora'"});
  // A compute dtype of another run.
  Config bf = equivalence_config(3);
  bf.bf16.enabled = true;
  MlpEngine bf16 = make_mlp_engine(bf, engine_world(), cpu_device());
  expect_checkpoint_error([&] { load_checkpoint(*bf16.engine, dir()); }, {"dtype f32 in the checkpoint, bf16"});
}

TEST_F(CheckpointTest, SaveRefusesBadTagsAndPartialAccumulation) {
  MlpEngine m = engine();
  for (const std::string& tag :
       std::vector<std::string>{"", "latest", ".hidden", "a/b", "two\nlines", " padded", std::string(201, 'x')}) {
    EXPECT_THROW(save_checkpoint(*m.engine, dir(), tag), InvalidArgument) << tag;
  }
  Batch b = make_batch(plan_.dims, plan_.data_seed, 0, plan_.micro_batch);
  mlp_micro_step(*m.engine, m.units, plan_.dims, b);
  m.engine->step();  // micro-step 1 of 2
  try {
    save_checkpoint(*m.engine, dir(), "mid");
    ADD_FAILURE() << "saved inside an accumulation window";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("accumulation window"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir() / "mid"));
  EXPECT_FALSE(checkpoint_exists(dir()));
}

TEST_F(CheckpointTest, LeftoversOfInterruptedSavesAreIgnoredThenRemoved) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "good");
  // A save that died before its rename, with a complete-looking manifest in it.
  const fs::path stale = ckpt::temp_dir_path(dir(), "good", 0x1234);
  fs::create_directories(stale);
  fs::copy(dir() / "good", stale, fs::copy_options::recursive);
  write_text(stale / "rank-00000-of-00001.safetensors", "garbage");
  EXPECT_EQ(list_checkpoints(dir()), std::vector<std::string>{"good"});
  MlpEngine fresh = engine();
  load_checkpoint(*fresh.engine, dir());  // reads DIR/good, not the temp dir
  save_checkpoint(*fresh.engine, dir(), "next");
  EXPECT_FALSE(fs::exists(stale));
}

TEST_F(CheckpointTest, ReplacementWithoutExchangeRecoversFromACrashBetweenItsRenames) {
  MlpEngine m = engine();
  train_steps(*m.engine, m.units, plan_, 0, 1);
  save_checkpoint(*m.engine, dir(), "r");
  const auto want = gather_params(*m.engine);
  // The state after "DIR/r -> DIR/.old-r-<nonce>" and before "temp -> DIR/r": the checkpoint only exists
  // under its .old name.
  const fs::path old = dir() / ".old-r-00000000000000ab";
  fs::rename(dir() / "r", old);
  EXPECT_TRUE(checkpoint_exists(dir()));
  MlpEngine fresh = engine();
  EXPECT_EQ(load_checkpoint(*fresh.engine, dir()).path, old);
  EXPECT_EQ(first_bit_difference(gather_params(*fresh.engine), want), "");
  // The next save's cleanup puts it back rather than deleting the only copy.
  ckpt::clean_interrupted_saves(dir());
  EXPECT_TRUE(fs::exists(dir() / "r" / "manifest.json"));
  EXPECT_FALSE(fs::exists(old));

  // The two-rename commit itself.
  const fs::path temp = ckpt::temp_dir_path(dir(), "r", 7);
  fs::create_directories(temp);
  fs::copy(dir() / "r", temp, fs::copy_options::recursive);
  std::optional<fs::path> replaced = ckpt::commit_directory(temp, dir(), "r", 7, /*try_exchange=*/false);
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ(replaced->filename().string(), ".old-r-0000000000000007");
  EXPECT_TRUE(fs::exists(dir() / "r" / "manifest.json"));
  ckpt::clean_interrupted_saves(dir());
  EXPECT_FALSE(fs::exists(*replaced));
}

TEST_F(CheckpointTest, LatestPointingNowhereIsAClearError) {
  expect_checkpoint_error([&] { read_checkpoint_info(dir()); }, {"latest is missing"});
  write_text(dir() / "latest", "gone\n");
  expect_checkpoint_error([&] { read_checkpoint_info(dir()); }, {"no checkpoint 'gone'"});
  write_text(dir() / "latest", "../etc\n");
  expect_checkpoint_error([&] { read_checkpoint_info(dir()); }, {"not hold a valid tag"});
  EXPECT_FALSE(checkpoint_exists(dir()));
}

TEST_F(CheckpointTest, ConsolidateWritesEveryTensorAsTheGatheredModel) {
  MlpEngine m = engine(3);
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "c");
  const auto want = gather_params(*m.engine);

  ExportOptions o;
  o.dtype = DType::f32;
  o.max_shard_bytes = 2000;  // several files and an index
  ExportedModel out = consolidate_checkpoint(dir(), "latest", dir() / "hf32", o);
  EXPECT_GT(out.files.size(), 2u);
  EXPECT_EQ(out.files.back(), "model.safetensors.index.json");
  EXPECT_EQ(out.tensors, 7);
  safetensors::ShardedSafetensorsReader r32(dir() / "hf32");
  // The MLP's units share local names (w, b), so the automatic rule picks full names.
  EXPECT_EQ(r32.names().size(), 7u);
  for (const auto& [name, values] : want) {
    std::vector<float> got(values.size());
    r32.read_as_f32(name, 0, static_cast<int64_t>(values.size()), got.data());
    EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size() * sizeof(float)), 0) << name;
  }

  o.dtype = DType::bf16;
  o.max_shard_bytes = 5'000'000'000;
  o.name_map = {{"head.w", "lm_head.weight"}};
  out = consolidate_checkpoint(dir(), "c", dir() / "hf16", o);
  EXPECT_EQ(out.files, std::vector<std::string>{"model.safetensors"});
  safetensors::SafetensorsReader r16(dir() / "hf16" / "model.safetensors");
  EXPECT_EQ(r16.tensor("lm_head.weight").shape, (std::vector<int64_t>{7, 29}));
  EXPECT_EQ(r16.tensor("fc1.w").dtype, safetensors::Dtype::bf16);
  for (const auto& [name, values] : want) {
    std::vector<uint16_t> got(values.size());
    r16.read_range(name == "head.w" ? "lm_head.weight" : name, 0, static_cast<int64_t>(values.size()), got.data());
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(values[i])) << name << "[" << i << "]";
  }
  // Local names would collide.
  o.naming = TensorNaming::local;
  expect_checkpoint_error([&] { consolidate_checkpoint(dir(), "c", dir() / "hfl", o); }, {"parameter named"});
}

TEST_F(CheckpointTest, Save16BitModelWritesEvenWhenTheConfigFlagIsOff) {
  MlpEngine m = engine(3);
  ASSERT_FALSE(m.engine->config().zero.gather_16bit_weights_on_model_save);
  train_steps(*m.engine, m.units, plan_, 0, 2);
  const auto want = gather_params(*m.engine);
  ExportedModel out = save_16bit_model(*m.engine, dir() / "bf16");
  EXPECT_EQ(out.dtype, DType::bf16);
  EXPECT_EQ(out.tensors, 7);
  EXPECT_EQ(out.bytes, fs::file_size(dir() / "bf16" / "model.safetensors"));
  EXPECT_NE(out.summary().find("7 tensors"), std::string::npos) << out.summary();
  safetensors::SafetensorsReader r(dir() / "bf16" / "model.safetensors");
  for (const auto& [name, values] : want) {
    std::vector<uint16_t> got(values.size());
    r.read_range(name, 0, static_cast<int64_t>(values.size()), got.data());
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(values[i])) << name << "[" << i << "]";
  }
}

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult zero3_command(const std::string& args) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  const std::string cmd = std::string(bin ? bin : ".") + "/zero3 " + args + " 2>&1";
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int ws = ::pclose(p);
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
  return r;
}

TEST_F(CheckpointTest, CkptCommandInspectsVerifiesAndConsolidates) {
  const char* bin = std::getenv("ZERO3_BIN_DIR");
  if (bin == nullptr || !fs::exists(fs::path(bin) / "zero3")) GTEST_SKIP() << "needs ZERO3_BIN_DIR/zero3";
  MlpEngine m = engine(2);
  train_steps(*m.engine, m.units, plan_, 0, 2);
  save_checkpoint(*m.engine, dir(), "s2", {{"epoch", "4"}});
  const auto want = gather_params(*m.engine);

  CommandResult r = zero3_command("ckpt inspect " + dir().string());
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* line : {"tag          s2 (DIR/latest names it)", "world size   1, ZeRO stage 2",
                           "steps        global 2 (applied 2, skipped 0), micro 4", "parameters   1867 in 4 units",
                           "extra        epoch = 4", "rank-00000-of-00001.safetensors", "verified: every file"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  r = zero3_command("ckpt list " + dir().string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("* s2"), std::string::npos) << r.output;

  write_text(dir() / "map.json", R"({"head.w": "lm_head.weight", "head.b": "lm_head.bias"})");
  r = zero3_command("ckpt consolidate " + (dir() / "s2").string() + " " + (dir() / "hf").string() +
                    " --dtype fp32 --max-shard-size 2KB --names full --name-map " + (dir() / "map.json").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("wrote 7 tensors (1867 parameters, f32)"), std::string::npos) << r.output;
  safetensors::ShardedSafetensorsReader hf(dir() / "hf");
  EXPECT_GT(hf.shard_count(), 1u);
  EXPECT_TRUE(hf.contains("lm_head.weight"));
  EXPECT_TRUE(hf.contains("fc1.w"));
  std::vector<float> got(want.at("head.w").size());
  hf.read_as_f32("lm_head.weight", 0, static_cast<int64_t>(got.size()), got.data());
  EXPECT_EQ(std::memcmp(got.data(), want.at("head.w").data(), got.size() * sizeof(float)), 0);

  EXPECT_EQ(zero3_command("ckpt consolidate " + dir().string() + " " + (dir() / "x").string() + " --dtype int8").status,
            2);
  // A corrupt file: inspect names it and exits 1; consolidate refuses.
  const fs::path file = dir() / "s2" / "rank-00000-of-00001.safetensors";
  std::string bytes = read_text(file);
  bytes[bytes.size() / 2] ^= 1;
  write_text(file, bytes);
  r = zero3_command("ckpt inspect " + dir().string() + " --tag s2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("BAD: CRC-32C mismatch"), std::string::npos) << r.output;
  r = zero3_command("ckpt consolidate " + dir().string() + " " + (dir() / "hf2").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("CRC-32C mismatch"), std::string::npos) << r.output;
  EXPECT_EQ(zero3_command("ckpt inspect " + dir().string() + " --no-verify").status, 0);
}

}  // namespace
}  // namespace zero3::testing

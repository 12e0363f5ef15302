// Killing a save: a 2-rank job (started with `zero3 launch`) ends at each point of a save, as a killed job would
// (ZERO3_TEST_CRASH_AT); afterwards the previous checkpoint and DIR/latest are intact, verify, and load with
// exactly the state that was saved, and the next save removes what the dead one left. A rank that dies alone
// makes the others' save fail with an error instead of a hang.
//
// The program is both the driver (run by ctest) and the job: the job's test runs only when the driver sets
// CKPT_FAULT_PHASE, and the driver's test only when it is unset.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "checkpoint/crash_point.hpp"
#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;

const char* phase() { return std::getenv("CKPT_FAULT_PHASE"); }

// The state a job saved, written beside the checkpoint so the driver can compare what it loads.
void write_state(const fs::path& path, const std::map<std::string, std::vector<float>>& state) {
  std::vector<st::TensorDecl> decls;
  for (const auto& [name, v] : state) decls.push_back({name, st::Dtype::f32, {static_cast<int64_t>(v.size())}});
  st::SafetensorsWriter w(path, decls);
  for (const auto& [name, v] : state) w.write(name, v.data(), v.size() * sizeof(float));
  w.finish();
}

std::map<std::string, std::vector<float>> read_state(const fs::path& path) {
  st::SafetensorsReader r(path);
  std::map<std::string, std::vector<float>> out;
  for (const st::TensorInfo& t : r.tensors()) {
    std::vector<float>& v = out[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    r.read_range(t.name, 0, t.numel(), v.data());
  }
  return out;
}

std::string expected_name(const std::string& tag, int64_t steps) {
  return "expected-" + tag + "-" + std::to_string(steps) + ".safetensors";
}

// ---- The job: trains `steps` steps on the launched ranks and saves them as TAG. ----
TEST(FaultJob, TrainAndSave) {
  if (phase() == nullptr) GTEST_SKIP() << "started by the driver below";
  const fs::path dir = std::getenv("CKPT_FAULT_DIR");
  const std::string tag = std::getenv("CKPT_FAULT_TAG");
  const int64_t steps = std::atoll(std::getenv("CKPT_FAULT_STEPS"));
  auto comm = engine_world();
  TrainPlan plan;
  plan.world = comm->size();
  MlpEngine m = make_mlp_engine(equivalence_config(3), comm, cpu_device());
  train_steps(*m.engine, m.units, plan, 0, steps);
  const auto state = gather_all_state(*m.engine);
  if (comm->rank() == 0) write_state(dir / expected_name(tag, steps), state);
  comm->barrier();
  if (std::string(phase()) == "survivor") {
    // Another rank dies in the middle of this save: this one must fail, not hang.
    try {
      save_checkpoint(*m.engine, dir, tag);
      ADD_FAILURE() << "the save succeeded although a rank died";
    } catch (const Error& e) {
      std::printf("save failed as expected: %s\n", e.what());
      std::fflush(stdout);
    }
    return;
  }
  save_checkpoint(*m.engine, dir, tag, {{"steps", std::to_string(steps)}});
}

// ---- The driver ----

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string zero3_bin() {
  const char* dir = std::getenv("ZERO3_BIN_DIR");
  return (dir ? fs::path(dir) : fs::path(self_exe()).parent_path()) / "zero3";
}

struct JobResult {
  int status = -1;
  std::string output;
};

JobResult run_job(const fs::path& dir, const std::string& tag, int64_t steps, const std::string& crash_at,
                  const std::string& job_phase = "save", bool keep_going = false) {
  const fs::path log = dir.parent_path() / (dir.filename().string() + "-" + tag + ".log");
  std::vector<std::string> args = {zero3_bin(), "launch", "-n", "2"};
  if (keep_going) args.push_back("--keep-going");
  for (const char* a : {"--", "", "--gtest_filter=FaultJob.*"}) args.push_back(a);
  args[args.size() - 2] = self_exe();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("CKPT_FAULT_PHASE", job_phase.c_str(), 1);
    ::setenv("CKPT_FAULT_DIR", dir.c_str(), 1);
    ::setenv("CKPT_FAULT_TAG", tag.c_str(), 1);
    ::setenv("CKPT_FAULT_STEPS", std::to_string(steps).c_str(), 1);
    if (crash_at.empty())
      ::unsetenv("ZERO3_TEST_CRASH_AT");
    else
      ::setenv("ZERO3_TEST_CRASH_AT", crash_at.c_str(), 1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  JobResult r;
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  std::ifstream in(log);
  std::stringstream s;
  s << in.rdbuf();
  r.output = s.str();
  return r;
}

bool has_leftovers(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0) return true;
  }
  return false;
}

// Loads DIR's latest checkpoint into a one-rank engine (a reshard from 2 ranks) and compares every state array
// with what the job that saved it (after `want_steps` steps) wrote down.
void expect_loads_as_saved(const fs::path& dir, const std::string& want_tag, int64_t want_steps) {
  EXPECT_EQ(resolve_checkpoint_tag(dir), want_tag);
  const CheckpointInfo info = verify_checkpoint(dir);  // every file's size and CRC-32C
  EXPECT_EQ(info.world_size, 2);
  MlpEngine m = make_mlp_engine(equivalence_config(3), engine_world(), cpu_device());
  const LoadedCheckpoint loaded = load_checkpoint(*m.engine, dir);
  EXPECT_EQ(loaded.tag, want_tag);
  EXPECT_EQ(loaded.training_state.global_steps, want_steps);
  EXPECT_EQ(loaded.extras.at("steps"), std::to_string(want_steps));
  EXPECT_EQ(first_bit_difference(gather_all_state(*m.engine), read_state(dir / expected_name(want_tag, want_steps))),
            "");
}

class CheckpointFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (phase() != nullptr) GTEST_SKIP() << "this process is a job";
    if (!fs::exists(zero3_bin())) GTEST_SKIP() << zero3_bin() << " is not built";
    auto backends = available_backends();
    if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo";
    root_ = std::make_unique<SharedTempDir>(*engine_world(), "zero3-ckpt-faults");
    // The previous checkpoint every scenario starts from: "a", 2 steps, saved by 2 ranks.
    base_ = root_->path() / "base";
    fs::create_directories(base_);
    const JobResult r = run_job(base_, "a", 2, "");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  fs::path scenario(const std::string& name) {
    const fs::path d = root_->path() / name;
    fs::copy(base_, d, fs::copy_options::recursive);
    return d;
  }
  std::unique_ptr<SharedTempDir> root_;
  fs::path base_;
};

TEST_F(CheckpointFaults, AJobKilledAtAnyPointOfASaveLeavesTheLastCheckpoint) {
  struct Case {
    std::string point;
    std::string tag;     // the tag the killed save (of 3 steps) writes; "a" replaces the previous one (2 steps)
    std::string latest;  // what DIR/latest names afterwards
    int64_t steps;       // and the steps of the checkpoint found there
  };
  const Case cases[] = {
      {"shard_partial", "b", "a", 2},   {"after_shards", "b", "a", 2},  {"before_manifest", "b", "a", 2},
      {"before_rename", "b", "a", 2},   {"before_latest", "b", "a", 2}, {"before_cleanup", "b", "b", 3},
      {"shard_partial@1", "a", "a", 2}, {"before_rename", "a", "a", 2}, {"before_latest", "a", "a", 3},
      {"before_cleanup", "a", "a", 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("killed at " + c.point + " while saving '" + c.tag + "'");
    const fs::path dir = scenario(c.point + "-" + c.tag);
    const JobResult r = run_job(dir, c.tag, 3, c.point);
    EXPECT_EQ(r.status, ckpt::kCrashExitStatus) << r.output;
    EXPECT_NE(r.output.find("ending the process at checkpoint point"), std::string::npos) << r.output;
    expect_loads_as_saved(dir, c.latest, c.steps);
    // Once renamed into place (before_latest, before_cleanup) the new checkpoint is complete even though
    // DIR/latest may not name it yet; before that it does not exist.
    const bool new_in_place = c.point == "before_latest" || c.point == "before_cleanup";
    if (c.tag == "b") {
      EXPECT_EQ(fs::exists(dir / "b"), new_in_place);
      if (new_in_place) {
        EXPECT_NO_THROW(verify_checkpoint(dir, "b"));
      }
    }
    // The next save cleans up after the dead one.
    MlpEngine m = make_mlp_engine(equivalence_config(3), engine_world(), cpu_device());
    load_checkpoint(*m.engine, dir);
    save_checkpoint(*m.engine, dir, "after");
    EXPECT_FALSE(has_leftovers(dir));
    EXPECT_NO_THROW(verify_checkpoint(dir, c.latest));
  }
}

TEST_F(CheckpointFaults, ARankDyingAloneMakesTheOthersFailNotHang) {
  const fs::path dir = scenario("survivor");
  const auto t0 = std::chrono::steady_clock::now();
  const JobResult r = run_job(dir, "b", 3, "after_shards@1", "survivor", /*keep_going=*/true);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, ckpt::kCrashExitStatus) << r.output;
  EXPECT_NE(r.output.find("[rank 0] save failed as expected"), std::string::npos) << r.output;
  EXPECT_LT(took, 50.0) << "the surviving rank waited for its collective timeout";
  expect_loads_as_saved(dir, "a", 2);
  EXPECT_FALSE(fs::exists(dir / "b"));
}

}  // namespace
}  // namespace zero3::testing

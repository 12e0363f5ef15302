// `zero3 launch` against a real training job that is hit from outside: the launcher killed with SIGKILL while a
// rank waits for the store and while both train (no rank may outlive it by more than 1 s), and one rank killed
// in the middle of training (the survivor's own error line must reach the launcher's output, every time).
//
// The program is both the driver (run by ctest) and the job: the job's test runs only when the driver sets
// LAUNCH_FAULT_PHASE, and the driver's tests only when it is unset.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "support/checkpoint_testing.hpp"
#include "support/engine_world.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* phase() { return std::getenv("LAUNCH_FAULT_PHASE"); }

// ---- The job: says who it is, joins the world and trains until something stops it. ----
TEST(LaunchFaultJob, TrainUntilStopped) {
  if (phase() == nullptr) GTEST_SKIP() << "started by the driver below";
  const int rank = std::atoi(std::getenv("RANK"));
  std::printf("job rank %d pid %d starting\n", rank, static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (std::string(phase()) == "late_rank0" && rank == 0) {
    // Rank 0 serves the store; while it sleeps the other ranks wait in the store's connect retry.
    std::this_thread::sleep_for(600s);
    return;
  }
  try {
    // A survivor notices a dead peer at once in most collectives, but Gloo does not fail a send that still waits
    // for the dead peer to post its receive: that one ends at the timeout. 5 s keeps the test short; the
    // driver gives the survivors longer than that to report (--report-grace).
    std::shared_ptr<Communicator> comm = connect(host_comm_options(5s));
    TrainPlan plan;
    plan.world = comm->size();
    MlpEngine m = make_mlp_engine(equivalence_config(3), comm, cpu_device());
    for (int64_t step = 0;; ++step) {
      train_steps(*m.engine, m.units, plan, step, 1);
      if (step == 0) {
        std::printf("job rank %d pid %d training\n", rank, static_cast<int>(::getpid()));
        std::fflush(stdout);
      }
    }
  } catch (const CommError& e) {
    // What a training program does with an error: one line, and a failing status.
    log::error("job: CommError: ", e.what());
    std::exit(1);
  } catch (const std::exception& e) {
    log::error("job: ", e.what());
    std::exit(1);
  }
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

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A process that has ended: gone, or a zombie its new parent has not reaped yet.
bool ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] == 'Z' || text[paren + 2] == 'X';
}

class LaunchFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (phase() != nullptr) GTEST_SKIP() << "this process is a job";
    if (!fs::exists(zero3_bin())) GTEST_SKIP() << zero3_bin() << " is not built";
    const auto backends = available_backends();
    if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo";
    char tmpl[] = "/tmp/zero3-launch-faults-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (launcher_ > 0) {
      ::kill(launcher_, SIGKILL);
      ::waitpid(launcher_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Starts `zero3 launch -n 2 [flags] -- <this program>` as the job of `job_phase`, its output in a file.
  void start(const std::string& job_phase, const std::vector<std::string>& flags = {}) {
    log_ = dir_ / (job_phase + "-" + std::to_string(++runs_) + ".log");
    std::vector<std::string> args = {zero3_bin(), "launch", "-n", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const std::string& a : {std::string("--"), self_exe(), std::string("--gtest_filter=LaunchFaultJob.*")}) {
      args.push_back(a);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    launcher_ = ::fork();
    if (launcher_ == 0) {
      ::setenv("LAUNCH_FAULT_PHASE", job_phase.c_str(), 1);
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }

  // The pids of the ranks once each has printed "job rank R pid P <what>", or an empty map after 60 s.
  std::map<int, pid_t> wait_for(const std::string& what) {
    const std::regex line("\\[rank (\\d+)\\] job rank \\d+ pid (\\d+) " + what);
    const auto deadline = Clock::now() + 60s;
    while (Clock::now() < deadline) {
      const std::string text = read_file(log_);
      std::map<int, pid_t> pids;
      for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
        pids[std::stoi((*it)[1])] = static_cast<pid_t>(std::stol((*it)[2]));
      }
      if (pids.size() == 2) return pids;
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "the ranks never printed '" << what << "':\n" << read_file(log_);
    return {};
  }

  // Waits for the launcher; returns its status (128+signal when killed).
  int finish() {
    int ws = 0;
    ::waitpid(launcher_, &ws, 0);
    launcher_ = -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  }

  // Kills the launcher with SIGKILL and expects every rank to have ended within 1 s.
  void kill_launcher_and_expect_no_rank_left(const std::map<int, pid_t>& ranks) {
    ASSERT_EQ(::kill(launcher_, SIGKILL), 0);
    const auto killed = Clock::now();
    EXPECT_EQ(finish(), 128 + SIGKILL);
    std::map<int, pid_t> alive = ranks;
    while (!alive.empty() && Clock::now() - killed < 1s) {
      for (auto it = alive.begin(); it != alive.end();) it = ended(it->second) ? alive.erase(it) : std::next(it);
      std::this_thread::sleep_for(5ms);
    }
    for (const auto& [rank, pid] : alive) {
      ADD_FAILURE() << "rank " << rank << " (pid " << pid << ") outlived the launcher by more than 1 s";
      ::kill(pid, SIGKILL);
    }
  }

  fs::path dir_, log_;
  pid_t launcher_ = -1;
  int runs_ = 0;
};

// Rank 0 has not started serving the store yet: rank 1 waits in the store's connect retry (600 s by default,
// 60 s here) when the launcher is killed.
TEST_F(LaunchFaults, KillingTheLauncherAtStartUpLeavesNoRank) {
  start("late_rank0");
  const std::map<int, pid_t> ranks = wait_for("starting");
  ASSERT_EQ(ranks.size(), 2u);
  std::this_thread::sleep_for(300ms);  // rank 1 is in the connect retry by now
  kill_launcher_and_expect_no_rank_left(ranks);
}

// Both ranks are training (and would go on for ever) when the launcher is killed.
TEST_F(LaunchFaults, KillingTheLauncherMidTrainingLeavesNoRank) {
  start("train");
  const std::map<int, pid_t> ranks = wait_for("training");
  ASSERT_EQ(ranks.size(), 2u);
  kill_launcher_and_expect_no_rank_left(ranks);
}

// One rank killed in the middle of training, five times (rank 0, which also serves the store, and rank 1 in
// turn): the launcher stops the job with the killed rank's status, and the survivor's own error line, which
// says what it saw, is in the output every time.
TEST_F(LaunchFaults, TheSurvivorsErrorReachesTheLogEveryTime) {
  for (int run = 0; run < 5; ++run) {
    const int victim = run % 2, survivor = 1 - victim;
    start("train", {"--report-grace", "15"});
    const std::map<int, pid_t> ranks = wait_for("training");
    ASSERT_EQ(ranks.size(), 2u);
    ASSERT_EQ(::kill(ranks.at(victim), SIGKILL), 0);
    EXPECT_EQ(finish(), 128 + SIGKILL) << "run " << run;
    const std::string out = read_file(log_);
    const std::string error_line =
        "[rank " + std::to_string(survivor) + "] [zero3 rank " + std::to_string(survivor) + "] ERROR job: CommError: ";
    EXPECT_NE(out.find(error_line), std::string::npos) << "run " << run << ", rank " << victim << " killed:\n" << out;
    EXPECT_NE(out.find("failed: rank " + std::to_string(victim) + " was killed by signal 9"), std::string::npos)
        << "run " << run << ":\n"
        << out;
  }
}

}  // namespace
}  // namespace zero3::testing

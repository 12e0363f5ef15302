// `zero3 launch` against a real training job that is hit from outside: the launcher killed with SIGKILL while a
// rank waits for the store and while both train (no rank may outlive it by more than 1 s), and one rank killed
// in the middle of training, in a forward gather, a backward reduce-scatter or at step() (every survivor's own
// error line, naming the dead rank, must reach the launcher's output every time, long before the comm timeout).
//
// The program is both the driver (run by ctest) and the job: the job's test runs only when the driver sets
// LAUNCH_FAULT_PHASE, and the driver's tests only when it is unset.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
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
#include "support/forwarding_comm.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* phase() { return std::getenv("LAUNCH_FAULT_PHASE"); }

// Where the victim of phase "die" kills itself: its `nth` call (counted from the second optimizer step on) of
// `point` (all_gather_into, reduce_scatter, or step: just before Engine::step()), `delay_us` after issuing it.
// Point "outside": the driver kills it, `delay_us` after it began training.
struct KillPoint {
  int victim = -1;
  std::string point;
  int nth = 0;
  int delay_us = 0;
};

KillPoint kill_point() {
  KillPoint k;
  if (const char* v = std::getenv("LAUNCH_FAULT_KILL")) {
    std::istringstream in(v);
    std::string field;
    std::getline(in, field, ':');
    k.victim = std::stoi(field);
    std::getline(in, k.point, ':');
    std::getline(in, field, ':');
    k.nth = std::stoi(field);
    std::getline(in, field, ':');
    k.delay_us = std::stoi(field);
  }
  return k;
}

// The victim's communicator: its own collectives, until the chosen one, after which the process dies with
// SIGKILL while that collective is on its way (queued, being compared, or moving data).
class DyingComm final : public ForwardingComm {
 public:
  DyingComm(std::shared_ptr<Communicator> inner, KillPoint kill)
      : ForwardingComm(std::move(inner)), kill_(std::move(kill)) {}
  void arm() { armed_ = true; }
  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) override {
    return maybe_die("all_gather_into", inner_->all_gather_into(out, in, count, dtype, stream));
  }
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    return maybe_die("reduce_scatter", inner_->reduce_scatter(out, in, count, dtype, op, stream));
  }

  void die_if(const std::string& point) {
    if (armed_ && point == kill_.point && ++seen_ == kill_.nth) die();
  }

 private:
  WorkPtr maybe_die(const char* point, WorkPtr work) {
    die_if(point);
    return work;
  }
  void die() {
    if (kill_.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(kill_.delay_us));
    ::raise(SIGKILL);
  }
  KillPoint kill_;
  std::atomic<bool> armed_{false};
  std::atomic<int> seen_{0};
};

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
    // A survivor must learn of a dead peer at once: the comm timeout is the default (600 s), far beyond the
    // launcher's report grace (3 s, its default).
    const KillPoint kill = kill_point();
    std::shared_ptr<Communicator> comm = connect(host_comm_options(600s));
    std::shared_ptr<DyingComm> dying;
    if (kill.victim == rank) comm = dying = std::make_shared<DyingComm>(comm, kill);
    TrainPlan plan;
    plan.world = comm->size();
    MlpEngine m = make_mlp_engine(equivalence_config(3), comm, cpu_device());
    const int64_t gas = m.engine->gradient_accumulation_steps();
    for (int64_t step = 0;; ++step) {
      for (int64_t micro = 0; micro < gas; ++micro) {
        Batch b =
            make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, rank, plan.world), plan.micro_batch);
        mlp_micro_step(*m.engine, m.units, plan.dims, b);
        if (dying) dying->die_if("step");
        m.engine->step();
      }
      if (step == 0) {
        if (dying) dying->arm();
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

  // Starts `zero3 launch -n <ranks> [flags] -- <this program>` as the job of `job_phase` (and `kill`, phase
  // "die"), its output in a file.
  void start(const std::string& job_phase, const std::vector<std::string>& flags = {}, int ranks = 2,
             const std::string& kill = "") {
    ranks_ = ranks;
    log_ = dir_ / (job_phase + "-" + std::to_string(++runs_) + ".log");
    std::vector<std::string> args = {zero3_bin(), "launch", "-n", std::to_string(ranks)};
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
      if (!kill.empty()) ::setenv("LAUNCH_FAULT_KILL", kill.c_str(), 1);
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
      if (static_cast<int>(pids.size()) == ranks_) return pids;
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
  int ranks_ = 2;
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

// One of 3 ranks kills itself (SIGKILL) in the middle of training: in a forward gather, in a backward
// reduce-scatter (each at once after issuing it, or a moment later, while it moves data) and just before step(),
// as rank 0 (which also serves the store) and as another rank; then the driver kills one at some moment of
// training (where a survivor could be left waiting on a send gloo had already handed to the dead connection). The
// launcher stops the job with the killed rank's status. Every survivor fails on its own with a CommError line naming
// the dead rank, whichever peer it was waiting for (the dead one, or a survivor that had already failed), within the
// launcher's default report grace (3 s) while its comm timeout is the default (600 s): a survivor that only the
// timeout would end is stopped by the launcher ("still running") without its line.
TEST_F(LaunchFaults, EverySurvivorReportsTheDeadRankPromptly) {
  const char* kills[] = {"0:all_gather_into:3:0",
                         "2:all_gather_into:7:300",
                         "1:reduce_scatter:2:0",
                         "0:reduce_scatter:5:200",
                         "2:step:1:0",
                         "0:step:2:0",
                         "0:outside:0:20000",
                         "1:outside:0:40000",
                         "0:outside:0:70000",
                         "1:outside:0:110000",
                         "0:outside:0:150000",
                         "1:outside:0:200000"};
  constexpr int kRanks = 3;
  for (const std::string kill : kills) {
    const int victim = kill[0] - '0';
    start("die", {}, kRanks, kill);
    const std::map<int, pid_t> ranks = wait_for("training");
    ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks)) << kill;
    if (kill.find(":outside:") != std::string::npos) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::stoi(kill.substr(kill.rfind(':') + 1))));
      ::kill(ranks.at(victim), SIGKILL);
    }
    const int status = finish();
    const std::string out = read_file(log_);
    EXPECT_EQ(status, 128 + SIGKILL) << kill << ":\n" << out;
    EXPECT_NE(out.find("failed: rank " + std::to_string(victim) + " was killed by signal 9"), std::string::npos)
        << kill << ":\n"
        << out;
    EXPECT_EQ(out.find("still running"), std::string::npos) << kill << ": the launcher had to stop a survivor:\n"
                                                            << out;
    for (int survivor = 0; survivor < kRanks; ++survivor) {
      if (survivor == victim) continue;
      const std::string head = "[rank " + std::to_string(survivor) + "] [zero3 rank " + std::to_string(survivor) +
                               "] ERROR job: CommError: ";
      const size_t at = out.find(head);
      const std::string line = at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
      EXPECT_NE(at, std::string::npos) << kill << ": no error line from rank " << survivor << ":\n" << out;
      EXPECT_TRUE(std::regex_search(line, std::regex("rank " + std::to_string(victim) + "\\b.*(died|exited|closed)")))
          << kill << ": rank " << survivor << "'s error does not name the dead rank " << victim << ": " << line;
    }
  }
}

}  // namespace
}  // namespace zero3::testing

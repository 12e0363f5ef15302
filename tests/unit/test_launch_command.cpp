// `zero3 launch`, run as a real process: environment, output prefixes, failure handling, signals.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "zero3/comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string zero3_bin() {
  const char* dir = std::getenv("ZERO3_BIN_DIR");
  return std::string(dir ? dir : ".") + "/zero3";
}

struct Result {
  int status = -1;  // exit code, or 128+signal
  std::string out, err;
  std::chrono::milliseconds took{0};
};

// Runs `zero3 launch ARGS`, with extra environment, capturing both streams. `on_start` runs with the
// launcher's pid once it started (for sending it signals).
Result launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              const std::function<void(pid_t)>& on_start = {}) {
  int out[2], err[2];
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(err), 0);
  std::vector<std::string> argv_s = {zero3_bin(), "launch"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto t0 = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (on_start) on_start(pid);
  Result r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open = 2;
  while (open > 0) {
    if (::poll(fds, 2, 30000) <= 0) break;
    for (auto& f : fds) {
      if (f.fd < 0 || !f.revents) continue;
      char buf[4096];
      ssize_t n = ::read(f.fd, buf, sizeof(buf));
      if (n <= 0) {
        ::close(f.fd);
        f.fd = -1;
        --open;
      } else {
        (f.fd == fds[0].fd ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  r.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  return r;
}

// Waits until process `pid` handles `sig`: blocks it (to read it from a signalfd, as the launcher does) or catches
// it (the SigBlk and SigCgt masks of /proc/PID/status), so a signal sent next is not the default action killing a
// process that is still starting up.
bool wait_until_handles(pid_t pid, int sig, std::chrono::milliseconds limit = 20s) {
  const auto deadline = Clock::now() + limit;
  const unsigned long long bit = 1ULL << (sig - 1);
  while (Clock::now() < deadline) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      const bool mask = line.rfind("SigBlk:", 0) == 0 || line.rfind("SigCgt:", 0) == 0;
      if (mask && (std::stoull(line.substr(7), nullptr, 16) & bit) != 0) return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A process linking zero3 keeps the default actions of SIGTERM, SIGSEGV and SIGABRT even when a dependency
// (libinfinipath, through libfabric) installed its own at load: a rank the launcher stops is "killed by signal 15",
// not "exited with status 1" from inside a signal handler.
TEST(RankSignals, ADependencyDoesNotTurnSignalsIntoExitOne) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool loaded = false;
  while (std::getline(maps, line)) loaded |= line.find("infinipath") != std::string::npos;
  if (!loaded) GTEST_SKIP() << "no libinfinipath in this process: nothing installs foreign handlers";
  for (int sig : {SIGTERM, SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGINT}) {
    struct sigaction current {};
    ASSERT_EQ(::sigaction(sig, nullptr, &current), 0);
    EXPECT_EQ(current.sa_handler, SIG_DFL) << strsignal(sig);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::raise(sig);
      ::_exit(0);
    }
    int ws = 0;
    ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(ws) && WTERMSIG(ws) == sig)
        << strsignal(sig) << ": " << (WIFEXITED(ws) ? "exited with status " + std::to_string(WEXITSTATUS(ws)) : "");
  }
}

TEST(ZeroLaunch, SetsTheVariablesAndPrefixesEveryLine) {
  auto r = launch({"-n", "3", "--", "sh", "-c",
                   "echo \"$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $ZERO3_LAUNCHER\"; "
                   "echo to-stderr >&2; printf no-newline"});
  EXPECT_EQ(r.status, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(
        contains(r.out, p + std::to_string(rank) + "/3 " + std::to_string(rank) + "/3 0 127.0.0.1 zero3-launch\n"))
        << r.out;
    EXPECT_TRUE(contains(r.out, p + "no-newline\n")) << r.out;
    EXPECT_TRUE(contains(r.err, p + "to-stderr\n")) << r.err;
  }
}

TEST(ZeroLaunch, PicksAFreePortOrTakesTheGivenOne) {
  auto a = launch({"-n", "1", "--", "sh", "-c", "echo $MASTER_PORT"});
  int port = std::atoi(a.out.substr(a.out.find("] ") + 2).c_str());
  EXPECT_GT(port, 1024) << a.out;
  auto b = launch({"-n", "1", "--master-port", "31999", "--", "sh", "-c", "echo $MASTER_PORT"});
  EXPECT_EQ(b.out, "[rank 0] 31999\n");
}

TEST(ZeroLaunch, OneFailingRankStopsTheOthers) {
  auto r = launch({"-n", "3", "--", "sh", "-c", "if [ $RANK = 1 ]; then exit 7; fi; exec sleep 30"});
  EXPECT_EQ(r.status, 7);
  EXPECT_LT(r.took, 10s);
  EXPECT_TRUE(contains(r.err, "rank 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with status 7")) << r.err;
  EXPECT_TRUE(contains(r.err, "stopping the other 2 rank(s)")) << r.err;
}

// The others are not cut short the moment a rank fails: they get --report-grace to print what they saw and exit
// on their own (a survivor notices a dead peer within milliseconds and says so), and only then SIGTERM.
TEST(ZeroLaunch, TheOthersHaveTimeToReportBeforeSigterm) {
  const std::string job = "if [ $RANK = 1 ]; then exit 3; fi; sleep 0.5; echo 'saw rank 1 go' >&2; exit 1";
  auto r = launch({"-n", "2", "--", "sh", "-c", job});
  EXPECT_EQ(r.status, 3);
  EXPECT_TRUE(contains(r.err, "[rank 0] saw rank 1 go\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGTERM in 3 s unless they exit")) << r.err;
  EXPECT_TRUE(contains(r.err, "then rank 0 exited with status 1")) << r.err;
  // Without the grace the survivor is stopped at once, before it can say anything.
  r = launch({"-n", "2", "--report-grace", "0", "--", "sh", "-c", job});
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(contains(r.err, "saw rank 1 go")) << r.err;
  EXPECT_TRUE(contains(r.err, "then rank 0 was killed by signal 15")) << r.err;
}

TEST(ZeroLaunch, ARankKilledByASignal) {
  auto r = launch({"-n", "2", "--", "sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 30"});
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_TRUE(contains(r.err, "rank 0")) << r.err;
  EXPECT_TRUE(contains(r.err, "signal 9")) << r.err;
}

TEST(ZeroLaunch, RanksThatIgnoreSigtermAreKilledAfterTheGrace) {
  auto r = launch({"-n", "2", "--grace", "0.3", "--", "sh", "-c",
                   "if [ $RANK = 1 ]; then sleep 0.5; exit 5; fi; trap '' TERM; while true; do sleep 0.05; done"});
  EXPECT_EQ(r.status, 5);
  EXPECT_LT(r.took, 10s);
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
}

TEST(ZeroLaunch, ForwardsSigterm) {
  auto r = launch({"-n", "2", "--", "sh", "-c", "echo up; exec sleep 30"}, {}, [](pid_t pid) {
    EXPECT_TRUE(wait_until_handles(pid, SIGTERM)) << "the launcher never took SIGTERM over";
    std::this_thread::sleep_for(500ms);  // the ranks are started too
    ::kill(pid, SIGTERM);
  });
  EXPECT_EQ(r.status, 128 + SIGTERM);
  EXPECT_LT(r.took, 10s);
  EXPECT_TRUE(contains(r.err, "passing it to every rank")) << r.err;
}

TEST(ZeroLaunch, KeepGoingLetsTheOthersFinish) {
  auto r = launch(
      {"-n", "2", "--keep-going", "--", "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; sleep 0.5; echo finished"});
  EXPECT_EQ(r.status, 3);
  EXPECT_TRUE(contains(r.out, "[rank 0] finished\n")) << r.out;
}

TEST(ZeroLaunch, KubeflowVariablesFillTheDefaults) {
  auto r = launch({"--", "sh", "-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR $MASTER_PORT"},
                  {"PET_NNODES=2", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=2", "PET_MASTER_ADDR=job-node-0-0.job",
                   "PET_MASTER_PORT=29500"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 2] 2 4 0 1 job-node-0-0.job 29500\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 3] 3 4 1 1 job-node-0-0.job 29500\n")) << r.out;
}

TEST(ZeroLaunch, SimulatedNodesStartEveryNodesRanksHereWithTheirNodesVariables) {
  auto r = launch({"--simulate-nodes", "3", "-n", "2", "--", "sh", "-c",
                   "echo \"$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR\""});
  EXPECT_EQ(r.status, 0) << r.err;
  for (int rank = 0; rank < 6; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "] " + std::to_string(rank) + "/6 " +
                             std::to_string(rank % 2) + "/2 " + std::to_string(rank / 2) + " 127.0.0.1\n";
    EXPECT_TRUE(contains(r.out, line)) << r.out;
  }
  EXPECT_EQ(launch({"--simulate-nodes", "2", "--nnodes", "2", "--", "true"}).status, 2);
  EXPECT_EQ(launch({"--simulate-nodes", "2", "--node-rank", "1", "--", "true"}).status, 2);
}

TEST(ZeroLaunch, UsageErrors) {
  EXPECT_EQ(launch({"-n", "2"}).status, 2);
  EXPECT_EQ(launch({"-n", "0", "--", "true"}).status, 2);
  EXPECT_EQ(launch({"--bogus", "--", "true"}).status, 2);
  EXPECT_EQ(launch({"--report-grace", "-1", "--", "true"}).status, 2);
  EXPECT_EQ(launch({"--grace", "soon", "--", "true"}).status, 2);
  EXPECT_EQ(launch({"--nnodes", "2", "--node-rank", "0", "--", "true"}).status, 2);  // needs --master-port
  EXPECT_EQ(launch({"--help"}).status, 0);
  auto r = launch({"-n", "1", "--", "/nonexistent/program"});
  EXPECT_EQ(r.status, 127);
  EXPECT_TRUE(contains(r.err, "cannot execute")) << r.err;
}

// Drives tests/dist/test_collectives_failure: rank 1 of 3 exits in the middle of an all_reduce. The others
// must report a CommError and finish their test, well before their 20 s timeout.
TEST(ZeroLaunchFailure, ADyingRankFailsTheOthersWithinTheTimeout) {
  auto backends = zero3::available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  std::string program =
      std::string(std::getenv("ZERO3_BIN_DIR") ? std::getenv("ZERO3_BIN_DIR") : ".") + "/test_collectives_failure";
  if (::access(program.c_str(), X_OK) != 0) GTEST_SKIP() << program << " is not built";
  auto r = launch({"-n", "3", "--keep-going", "--", program}, {"DIST_TEST_DYING_RANK=1"});
  EXPECT_EQ(r.status, 42) << r.out << r.err;
  EXPECT_LT(r.took, 20s) << "the surviving ranks waited for their timeout instead of seeing the failure";
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 leaves in the middle of all_reduce")) << r.out;
  for (int rank : {0, 2}) {
    std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "rank " + std::to_string(rank) + " saw after")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "[  PASSED  ] 1 test")) << r.out;
  }
  EXPECT_TRUE(contains(r.err, "rank 1 (pid")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with status 42")) << r.err;
}

// Drives tests/dist/test_collectives_failure: rank 1 of 2 exits while rank 0 broadcasts 256 MiB to it; rank 0,
// which only sends, must report a CommError naming rank 1 and finish its test, long before its timeout.
TEST(ZeroLaunchFailure, ASendToADeadRankFailsAtOnce) {
  auto backends = zero3::available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  std::string program =
      std::string(std::getenv("ZERO3_BIN_DIR") ? std::getenv("ZERO3_BIN_DIR") : ".") + "/test_collectives_failure";
  if (::access(program.c_str(), X_OK) != 0) GTEST_SKIP() << program << " is not built";
  auto r = launch({"-n", "2", "--keep-going", "--", program}, {"DIST_TEST_DEAD_RECEIVER=1"});
  EXPECT_EQ(r.status, 43) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 leaves in the middle of a broadcast")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 0] rank 0 saw after")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 0] [  PASSED  ] 1 test")) << r.out;
}

// Drives tests/dist/test_send_recv: the middle rank of three is killed (SIGKILL) while it receives from rank 0 and
// before it sends to rank 2; both neighbours must report a CommError naming the transfer and rank 1 and finish
// their test, long before their 120 s timeout.
TEST(ZeroLaunchFailure, AKilledPipelinePeerIsNamedOnItsNeighbours) {
  auto backends = zero3::available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  std::string program =
      std::string(std::getenv("ZERO3_BIN_DIR") ? std::getenv("ZERO3_BIN_DIR") : ".") + "/test_send_recv";
  if (::access(program.c_str(), X_OK) != 0) GTEST_SKIP() << program << " is not built";
  auto r = launch({"-n", "3", "--keep-going", "--", program, "--gtest_filter=SendRecvFailure.*"},
                  {"DIST_TEST_KILLED_PEER=1"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.out << r.err;
  EXPECT_LT(r.took, 60s) << "the neighbours waited for their timeout instead of seeing the failure";
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 is killed in the middle of a receive")) << r.out;
  for (int rank : {0, 2}) {
    std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "rank " + std::to_string(rank) + " saw after")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "[  PASSED  ] 1 test")) << r.out;
  }
}

// Drives tests/dist/test_pipeline_equivalence: 4 pipeline stages, stage 1 killed (SIGKILL) in the middle of a step;
// ranks 0, 2 and 3 must each end train_batch() with a CommError naming their stage and a transfer, and finish.
TEST(ZeroLaunchFailure, AKilledPipelineStageEndsEveryRankWithANamedError) {
  auto backends = zero3::available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  std::string program =
      std::string(std::getenv("ZERO3_BIN_DIR") ? std::getenv("ZERO3_BIN_DIR") : ".") + "/test_pipeline_equivalence";
  if (::access(program.c_str(), X_OK) != 0) GTEST_SKIP() << program << " is not built";
  auto r = launch({"-n", "4", "--keep-going", "--", program, "--gtest_filter=PipelineFailure.*"},
                  {"DIST_TEST_KILLED_STAGE=1"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.out << r.err;
  EXPECT_LT(r.took, 60s) << "the ranks waited for their timeout instead of seeing the failure";
  EXPECT_TRUE(contains(r.out, "[rank 1] stage 1 is killed")) << r.out;
  for (int rank : {0, 2, 3}) {
    std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "rank " + std::to_string(rank) + " saw after")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "[  PASSED  ] 1 test")) << r.out;
  }
}

}  // namespace

namespace {

// Starts `program` once per rank with the given per-rank environment and no launcher at all; returns each
// process's exit status.
std::vector<int> run_ranks(const std::string& program, const std::vector<std::vector<std::string>>& envs) {
  std::vector<pid_t> pids;
  for (const auto& env : envs) {
    pid_t pid = ::fork();
    if (pid == 0) {
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::execl(program.c_str(), program.c_str(), static_cast<char*>(nullptr));
      ::_exit(126);
    }
    pids.push_back(pid);
  }
  std::vector<int> status;
  for (pid_t pid : pids) {
    int ws = 0;
    ::waitpid(pid, &ws, 0);
    status.push_back(WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws));
  }
  return status;
}

int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The same dist program, started without `zero3 launch`: torchrun-style variables set by hand, then the
// variables torchrun itself sets (its agent owns MASTER_PORT, so zero3's store moves to MASTER_PORT + 1).
TEST(OtherLaunchers, TorchrunStyleVariablesSetByHand) {
  auto backends = zero3::available_backends();
  if (std::find(backends.begin(), backends.end(), "gloo") == backends.end()) GTEST_SKIP() << "no gloo in this build";
  std::string program =
      std::string(std::getenv("ZERO3_BIN_DIR") ? std::getenv("ZERO3_BIN_DIR") : ".") + "/test_collectives_connect";
  if (::access(program.c_str(), X_OK) != 0) GTEST_SKIP() << program << " is not built";
  for (bool torchrun : {false, true}) {
    int port = free_tcp_port();
    std::vector<std::vector<std::string>> envs;
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<std::string> env = {"RANK=" + std::to_string(rank), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                      "MASTER_PORT=" + std::to_string(port), "ZERO3_LAUNCHER="};
      if (torchrun) {
        env.insert(env.end(), {"LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0",
                               "TORCHELASTIC_RUN_ID=by-hand", "TORCHELASTIC_RESTART_COUNT=0"});
      }
      envs.push_back(env);
    }
    // Under "torchrun", something else holds MASTER_PORT, as torchrun's agent would.
    int holder = -1;
    if (torchrun) {
      holder = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
      ASSERT_EQ(::listen(holder, 4), 0);
    }
    EXPECT_EQ(run_ranks(program, envs), (std::vector<int>{0, 0})) << (torchrun ? "torchrun variables" : "by hand");
    if (holder >= 0) ::close(holder);
  }
}

}  // namespace

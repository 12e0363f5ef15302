// A rank started with another world size than its peers, or two processes started as the same rank, fail at
// rendezvous with an error naming the launcher's variables, the values and the processes, on every rank that
// hears of it, instead of Gloo's "enforce fail at address.cc:45 ... 136 vs 272" (which names neither). Real
// processes: each is forked from this test and calls connect() with an environment of its own, as a launcher
// (or a person) would start it.
#include <arpa/inet.h>
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
#include <string>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/error.hpp"

namespace {

using namespace std::chrono_literals;

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

struct Outcome {
  std::string text;  // "ok", or the error's type and message
  std::chrono::milliseconds took{0};
};

// Starts one process per (RANK, WORLD_SIZE) pair; each joins the job through connect() (gloo) and reports.
std::vector<Outcome> start_ranks(const std::vector<std::pair<int, int>>& rank_and_world) {
  const int port = free_tcp_port();
  struct Child {
    pid_t pid;
    int fd;
  };
  std::vector<Child> children;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [rank, world] : rank_and_world) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      for (const char* name : {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "ZERO3_LAUNCHER",
                               "ZERO3_STORE_PORT", "ZERO3_COMM_TIMEOUT_S"}) {
        ::unsetenv(name);
      }
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::string report;
      try {
        zero3::CommOptions options;
        options.backend = "gloo";
        options.timeout = 30s;
        auto comm = zero3::connect(options);
        comm->barrier();  // no process leaves (closing its connections) before every one has joined
        report = "ok";
      } catch (const zero3::TimeoutError& e) {
        report = std::string("TimeoutError: ") + e.what();
      } catch (const zero3::CommError& e) {
        report = std::string("CommError: ") + e.what();
      } catch (const std::exception& e) {
        report = std::string("other: ") + e.what();
      }
      [[maybe_unused]] ssize_t n = ::write(p[1], report.data(), report.size());
      ::_exit(0);
    }
    ::close(p[1]);
    children.push_back({pid, p[0]});
  }
  std::vector<Outcome> out(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    std::string text;
    char buf[4096];
    pollfd fd{children[i].fd, POLLIN, 0};
    while (::poll(&fd, 1, 60000) > 0) {
      ssize_t n = ::read(children[i].fd, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(children[i].fd);
    ::kill(children[i].pid, SIGKILL);  // a no-op for a process that finished; ends one that hangs
    int status = 0;
    ::waitpid(children[i].pid, &status, 0);
    out[i].text = text.empty() ? "no report (the process hung or died)" : text;
    out[i].took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  }
  return out;
}

bool has_gloo() {
  auto b = zero3::available_backends();
  return std::find(b.begin(), b.end(), "gloo") != b.end();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(LaunchAgreement, AgreeingRanksJoin) {
  if (!has_gloo()) GTEST_SKIP() << "no gloo in this build";
  auto out = start_ranks({{0, 2}, {1, 2}});
  for (const Outcome& o : out) EXPECT_EQ(o.text, "ok");
}

TEST(LaunchAgreement, AnotherWorldSizeIsNamedOnEveryRank) {
  if (!has_gloo()) GTEST_SKIP() << "no gloo in this build";
  // Rank 1 thinks the job has 4 ranks, rank 0 that it has 2 (Gloo's "136 vs 272"); then the other way round.
  for (auto [zero_world, one_world] : {std::pair{2, 4}, std::pair{3, 2}}) {
    auto out = start_ranks({{0, zero_world}, {1, one_world}});
    for (size_t r = 0; r < out.size(); ++r) {
      const std::string& m = out[r].text;
      SCOPED_TRACE("rank " + std::to_string(r) + ": " + m);
      EXPECT_TRUE(contains(m, "CommError: the ranks were started with different world sizes"));
      EXPECT_TRUE(contains(m, "rank 0 (pid "));
      EXPECT_TRUE(contains(m, "has WORLD_SIZE=" + std::to_string(zero_world) + ", rank 1 ("));
      EXPECT_TRUE(contains(m, "has WORLD_SIZE=" + std::to_string(one_world) + ". Start every rank"));
      EXPECT_LT(out[r].took, 20s) << "found by a timeout instead of the comparison";
    }
  }
}

TEST(LaunchAgreement, TwoProcessesWithOneRankAreNamed) {
  if (!has_gloo()) GTEST_SKIP() << "no gloo in this build";
  auto out = start_ranks({{0, 3}, {1, 3}, {1, 3}});
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string& m = out[i].text;
    SCOPED_TRACE("process " + std::to_string(i) + ": " + m);
    EXPECT_TRUE(contains(m, "CommError: two processes were started as rank 1 (RANK=1): pid "));
    EXPECT_TRUE(contains(m, "which came second and stops the job"));
    EXPECT_TRUE(contains(m, "Give every process of the job its own RANK"));
    EXPECT_LT(out[i].took, 20s) << "found by a timeout instead of the comparison";
  }
}

}  // namespace

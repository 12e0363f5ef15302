// `zero3 launch`: start N ranks of a program on this node, the way torchrun's standalone mode does, with
// the same environment variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT) plus ZERO3_LAUNCHER=zero3-launch. Every output line is prefixed with its rank. Signals reach
// every rank. When one rank fails the others get a moment to report what they saw and exit, then are stopped
// (SIGTERM, then SIGKILL after a grace period), and the launcher exits with the failing rank's status
// (128+signal for a signal). The ranks die with the launcher (parent-death signal).
//
// Under a Kubeflow TrainJob the node count, node rank, master address and port, and the processes per node
// come from PET_*, so a pod's command can be `zero3 launch -- /app/train ...`.
//
// --simulate-nodes M starts the ranks of M nodes on this machine, each rank with the variables its node would
// give it (LOCAL_WORLD_SIZE = N, its LOCAL_RANK and GROUP_RANK): how tests run layouts that depend on the nodes
// (hpZ, MiCS) on one machine.
#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"

extern char** environ;

namespace zero3::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: zero3 launch [-n N] [--nnodes M --node-rank R | --simulate-nodes M] [--master-addr A]\n"
    "                    [--master-port P] [--report-grace SECONDS] [--grace SECONDS] [--keep-going]\n"
    "                    -- PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this node (torchrun's variables set for each) and waits for them.\n"
    "  -n, --nproc-per-node N  ranks on this node (default: PET_NPROC_PER_NODE, else 1)\n"
    "  --nnodes M              nodes in the job (default: PET_NNODES, else 1)\n"
    "  --node-rank R           this node's index (default: PET_NODE_RANK, else 0)\n"
    "  --simulate-nodes M      start the N ranks of each of M nodes here, each with its node's variables\n"
    "                          (LOCAL_WORLD_SIZE=N, LOCAL_RANK, GROUP_RANK): a multi-node layout on one machine\n"
    "  --master-addr A         host of rank 0 (default: PET_MASTER_ADDR, else 127.0.0.1)\n"
    "  --master-port P         port of zero3's store (default: PET_MASTER_PORT; a free port on one node)\n"
    "  --report-grace SECONDS  when a rank fails, let the others report and exit on their own for this long\n"
    "                          before sending them SIGTERM (default 3)\n"
    "  --grace SECONDS         after SIGTERM, wait this long before SIGKILL (default 5)\n"
    "  --keep-going            when a rank fails, let the others run to their end (fault-injection tests)\n"
    "Exit status: 0 when every rank succeeded, else the first failing rank's (128+signal if killed).\n";

struct LaunchOptions {
  int nproc = 0;
  int nnodes = 1;
  int node_rank = 0;
  bool simulate_nodes = false;  // every node's ranks start here
  std::string master_addr;
  int master_port = 0;
  double report_grace_s = 3.0;
  double grace_s = 5.0;
  bool keep_going = false;
  std::vector<std::string> command;
};

class UsageError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

int to_int(const std::string& text, const std::string& what, int min_value, int max_value) {
  size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != text.size() || v < min_value || v > max_value) {
    throw UsageError(what + " '" + text + "': expected an integer in " + std::to_string(min_value) + ".." +
                     std::to_string(max_value));
  }
  return static_cast<int>(v);
}

std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

// Devices the container sees: /dev/nvidia0, /dev/nvidia1, ... (not nvidiactl, nvidia-uvm).
int count_gpu_device_files() {
  glob_t g{};
  int n = 0;
  if (::glob("/dev/nvidia[0-9]*", 0, nullptr, &g) == 0) n = static_cast<int>(g.gl_pathc);
  ::globfree(&g);
  return n;
}

int nproc_from_kubeflow(const std::string& value) {
  if (!value.empty() && std::isdigit(static_cast<unsigned char>(value[0]))) {
    return to_int(value, "PET_NPROC_PER_NODE", 1, 4096);
  }
  int gpus = count_gpu_device_files();
  if (value == "gpu" && gpus == 0) throw UsageError("PET_NPROC_PER_NODE=gpu but no /dev/nvidiaN device is visible");
  if (value == "cpu") return 1;
  std::fprintf(stderr, "zero3 launch: PET_NPROC_PER_NODE=%s: %d GPU device(s) visible, starting %d rank(s)\n",
               value.c_str(), gpus, gpus > 0 ? gpus : 1);
  return gpus > 0 ? gpus : 1;
}

LaunchOptions parse(const Args& args) {
  LaunchOptions o;
  std::optional<int> nproc, nnodes, node_rank, port, simulated;
  std::optional<std::string> addr;
  size_t i = 0;
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") throw UsageError("");
    if (a == "-n" || a == "--nproc-per-node" || a == "--nproc_per_node") {
      nproc = to_int(value(a), a, 1, 4096);
    } else if (a == "--nnodes") {
      nnodes = to_int(value(a), a, 1, 1 << 20);
    } else if (a == "--node-rank" || a == "--node_rank") {
      node_rank = to_int(value(a), a, 0, (1 << 20) - 1);
    } else if (a == "--simulate-nodes") {
      simulated = to_int(value(a), a, 1, 4096);
    } else if (a == "--master-addr" || a == "--master_addr") {
      addr = value(a);
    } else if (a == "--master-port" || a == "--master_port") {
      port = to_int(value(a), a, 1, 65535);
    } else if (a == "--grace" || a == "--report-grace") {
      std::string v = value(a);
      char* end = nullptr;
      const double seconds = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(seconds >= 0) || seconds > 86400) {
        throw UsageError(a + " '" + v + "': expected seconds in 0..86400");
      }
      (a == "--grace" ? o.grace_s : o.report_grace_s) = seconds;
    } else if (a == "--keep-going") {
      o.keep_going = true;
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("unknown option '" + a + "'");
    } else {
      break;  // the program
    }
  }
  o.command.assign(args.begin() + static_cast<ptrdiff_t>(i), args.end());
  if (o.command.empty()) throw UsageError("no program to launch (put it after --)");

  if (simulated) {
    if (nnodes || node_rank) {
      throw UsageError("--simulate-nodes starts every node here: leave out --nnodes and --node-rank");
    }
    nnodes = *simulated;
    node_rank = 0;
    o.simulate_nodes = true;
  }
  // Kubeflow Trainer's PET_* fill whatever the flags leave open.
  auto pet = [](const char* name) { return env_var(name); };
  if (!nnodes && pet("PET_NNODES")) nnodes = to_int(*pet("PET_NNODES"), "PET_NNODES", 1, 1 << 20);
  if (!node_rank && pet("PET_NODE_RANK")) node_rank = to_int(*pet("PET_NODE_RANK"), "PET_NODE_RANK", 0, (1 << 20) - 1);
  if (!addr && pet("PET_MASTER_ADDR")) addr = pet("PET_MASTER_ADDR");
  if (!port && pet("PET_MASTER_PORT")) port = to_int(*pet("PET_MASTER_PORT"), "PET_MASTER_PORT", 1, 65535);
  if (!nproc && pet("PET_NPROC_PER_NODE")) nproc = nproc_from_kubeflow(*pet("PET_NPROC_PER_NODE"));

  o.nproc = nproc.value_or(1);
  o.nnodes = nnodes.value_or(1);
  o.node_rank = node_rank.value_or(0);
  if (o.node_rank >= o.nnodes) {
    throw UsageError("node rank " + std::to_string(o.node_rank) + " is not below the node count " +
                     std::to_string(o.nnodes));
  }
  o.master_addr = addr.value_or("127.0.0.1");
  if (port) {
    o.master_port = *port;
  } else if (o.nnodes > 1 && !o.simulate_nodes) {
    throw UsageError("--master-port is required with several nodes (every node must use the same one)");
  }
  return o;
}

// A port nobody listens on right now, for the store of a single-node job. Rank 0 binds it a moment later;
// the kernel hands out ephemeral ports round-robin, so a parallel launcher is unlikely to get the same one.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(err));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One output stream of one rank: bytes in, prefixed whole lines out.
struct Stream {
  int fd = -1;     // read end, -1 once closed
  int out_fd = 1;  // where its lines go
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;   // exit code, or 128+signal
  std::string how;  // "exited with status 3", "was killed by signal 9 (Killed)"
  Stream out, err;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone: nothing sensible left to do with it
    off += static_cast<size_t>(n);
  }
}

void emit_lines(Stream& s, const std::string& prefix, bool at_eof) {
  size_t start = 0;
  std::string out;
  while (true) {
    size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(s.pending, start, nl - start + 1);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  // A very long line, or the rest at EOF, goes out as it is.
  if (!s.pending.empty() && (at_eof || s.pending.size() >= 64 * 1024)) {
    out += prefix + s.pending + "\n";
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.out_fd, out);
}

void read_stream(Stream& s, const std::string& prefix) {
  char buf[16384];
  ssize_t n = ::read(s.fd, buf, sizeof(buf));
  if (n > 0) {
    s.pending.append(buf, static_cast<size_t>(n));
    emit_lines(s, prefix, false);
    return;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  emit_lines(s, prefix, true);
  ::close(s.fd);
  s.fd = -1;
}

std::string describe_status(int wstatus, int* code) {
  if (WIFEXITED(wstatus)) {
    *code = WEXITSTATUS(wstatus);
    return "exited with status " + std::to_string(*code);
  }
  int sig = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
  *code = 128 + sig;
  return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
}

class Launcher {
 public:
  explicit Launcher(LaunchOptions o) : o_(std::move(o)) {}

  int run();

 private:
  void spawn(Rank& r, const std::vector<std::string>& env);
  void signal_all(int sig);
  void begin_stop(int sig);
  void reap();
  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }
  void note(const std::string& line) { write_all(2, "zero3 launch: " + line + "\n"); }

  LaunchOptions o_;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  Clock::time_point term_at_ = Clock::time_point::max();  // a rank failed: SIGTERM to the others then
  Clock::time_point kill_at_ = Clock::time_point::max();
  std::optional<size_t> first_failure_;
  bool first_failure_after_stop_ = false;  // the first failure came after we began stopping the ranks
  int launcher_signal_ = 0;
};

void Launcher::spawn(Rank& r, const std::vector<std::string>& env_strings) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : o_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  sigset_t none;
  sigemptyset(&none);
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t launcher = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The rank dies with the launcher (SIGKILL, a crash, the OOM killer): nothing would read its output or its
    // status any more, and a rank training on alone could still write checkpoints. The signal fires when the
    // thread that forked exits, which here is the launcher's only thread; it survives execve. The launcher may
    // have died before prctl, in which case the rank has been re-parented already.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);
    // Own process group: the terminal's Ctrl-C reaches the launcher only (which forwards it once), and a
    // rank's own children are stopped with it.
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    ::signal(SIGCHLD, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "zero3 launch: cannot execute the program\n";
    [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from here, so the group exists before any signal we send
  if (devnull >= 0) ::close(devnull);
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.running = true;
  r.out = Stream{out[0], 1, {}};
  r.err = Stream{err[0], 2, {}};
}

void Launcher::signal_all(int sig) {
  for (auto& r : ranks_) {
    if (r.running) ::kill(-r.pid, sig);
  }
}

void Launcher::begin_stop(int sig) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000));
  }
  signal_all(sig);
}

void Launcher::reap() {
  // Everything that has ended since the last look. When a rank is killed, the others usually notice within
  // milliseconds and exit with an error of their own: both may be collected here together, and the rank killed
  // by a signal is then taken for the first failure, not the one that merely saw it go.
  std::vector<std::pair<size_t, int>> ended;
  while (true) {
    int wstatus = 0;
    pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
    if (pid <= 0) break;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].pid == pid && ranks_[i].running) ended.emplace_back(i, wstatus);
    }
  }
  std::stable_partition(ended.begin(), ended.end(), [](const auto& e) { return WIFSIGNALED(e.second); });
  for (const auto& [i, wstatus] : ended) {
    ranks_[i].running = false;
    ranks_[i].how = describe_status(wstatus, &ranks_[i].status);
  }
  for (const auto& [i, wstatus] : ended) {
    const Rank& r = ranks_[i];
    if (r.status == 0) continue;
    bool first = !first_failure_;
    if (first) {
      first_failure_ = i;
      first_failure_after_stop_ = stopping_;
    }
    size_t others = 0;
    for (auto& x : ranks_) others += x.running;
    const std::string who = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " + r.how;
    if (first && !stopping_ && !o_.keep_going && others > 0) {
      // The others get a moment to report what they saw (their error line) and exit on their own before
      // SIGTERM, which would cut them short.
      note(who + "; stopping the other " + std::to_string(others) + " rank(s) (SIGTERM in " +
           format_seconds(o_.report_grace_s) + " s unless they exit)");
      term_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.report_grace_s * 1000));
    } else if (!stopping_) {
      note(who);
    }
  }
}

int Launcher::run() {
  int world = o_.nnodes * o_.nproc;
  if (o_.master_port == 0) o_.master_port = free_port();

  // A closed stdout (`zero3 launch ... | head`) must not kill the launcher and orphan the ranks.
  ::signal(SIGPIPE, SIG_IGN);
  // Signals arrive through a descriptor, in the same poll as the ranks' output.
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  int sfd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));

  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    static const char* kOurs[] = {"RANK",       "WORLD_SIZE",  "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                  "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "ZERO3_LAUNCHER"};
    bool ours = false;
    for (const char* n : kOurs) ours |= name == n;
    if (!ours) base_env.push_back(kv);
  }
  const int first_node = o_.node_rank;
  const int last_node = o_.simulate_nodes ? o_.nnodes - 1 : o_.node_rank;
  ranks_.resize(static_cast<size_t>((last_node - first_node + 1) * o_.nproc));
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    const int node = first_node + static_cast<int>(i) / o_.nproc;
    const int local = static_cast<int>(i) % o_.nproc;
    r.rank = node * o_.nproc + local;
    std::vector<std::string> env = base_env;
    env.push_back("RANK=" + std::to_string(r.rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o_.nproc));
    env.push_back("GROUP_RANK=" + std::to_string(node));
    env.push_back("MASTER_ADDR=" + o_.master_addr);
    env.push_back("MASTER_PORT=" + std::to_string(o_.master_port));
    env.push_back("ZERO3_LAUNCHER=zero3-launch");
    spawn(r, env);
  }

  Clock::time_point drain_until = Clock::time_point::max();
  std::vector<pollfd> fds;
  std::vector<std::pair<Stream*, int>> owners;  // stream and its rank
  while (true) {
    bool any_running = false;
    for (auto& r : ranks_) any_running |= r.running;
    if (!any_running && drain_until == Clock::time_point::max()) {
      // The ranks are gone; whatever they started may still hold the pipes. Give it a moment, not forever.
      drain_until = Clock::now() + std::chrono::seconds(2);
    }
    fds.clear();
    owners.clear();
    fds.push_back({sfd, POLLIN, 0});
    owners.push_back({nullptr, -1});
    for (auto& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({s, r.rank});
        }
      }
    }
    if (!any_running && (fds.size() == 1 || Clock::now() >= drain_until)) break;
    Clock::time_point wake = std::min({term_at_, kill_at_, drain_until});
    int timeout = -1;
    if (wake != Clock::time_point::max()) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
      timeout = ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
    }
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if (i == 0) {
        signalfd_siginfo si;
        while (::read(sfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
          int sig = static_cast<int>(si.ssi_signo);
          if (sig == SIGCHLD) continue;  // reaped below
          if (launcher_signal_ && sig == SIGINT) {
            note("second interrupt: killing every rank");
            signal_all(SIGKILL);
            continue;
          }
          launcher_signal_ = sig;
          note(std::string("received ") + strsignal(sig) + "; passing it to every rank");
          begin_stop(sig);
        }
      } else {
        auto [s, rank] = owners[i];
        read_stream(*s, "[rank " + std::to_string(rank) + "] ");
      }
    }
    reap();
    if (Clock::now() >= term_at_) {
      term_at_ = Clock::time_point::max();
      size_t left = 0;
      for (auto& r : ranks_) left += r.running;
      if (left && !stopping_) {
        note(std::to_string(left) + " rank(s) still running " + format_seconds(o_.report_grace_s) +
             " s after the failure: sending SIGTERM");
        begin_stop(SIGTERM);
      }
    }
    if (stopping_ && Clock::now() >= kill_at_) {
      size_t left = 0;
      for (auto& r : ranks_) left += r.running;
      if (left) note(std::to_string(left) + " rank(s) still running after the grace period: sending SIGKILL");
      signal_all(SIGKILL);
      kill_at_ = Clock::time_point::max();
    }
  }
  for (auto& r : ranks_) {
    for (Stream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) {
        emit_lines(*s, "[rank " + std::to_string(r.rank) + "] ", true);
        ::close(s->fd);
      }
    }
  }
  ::close(sfd);

  if (launcher_signal_) {
    note(std::string("stopped by ") + strsignal(launcher_signal_));
    // A rank that failed on its own before the signal keeps its status; ranks we stopped do not count.
    return first_failure_ && !first_failure_after_stop_ ? ranks_[*first_failure_].status : 128 + launcher_signal_;
  }
  if (first_failure_) {
    const Rank& r = ranks_[*first_failure_];
    std::string others;
    for (const auto& x : ranks_) {
      if (&x != &r && x.status != 0)
        others += (others.empty() ? "" : ", ") + ("rank " + std::to_string(x.rank) + " " + x.how);
    }
    note("failed: rank " + std::to_string(r.rank) + " " + r.how + (others.empty() ? "" : "; then " + others));
    return r.status;
  }
  return 0;
}

}  // namespace

int run_launch(const Args& args) {
  LaunchOptions options;
  try {
    options = parse(args);
  } catch (const UsageError& e) {
    bool help = std::string(e.what()).empty();
    if (!help) std::fprintf(stderr, "zero3 launch: %s\n\n", e.what());
    std::fputs(kUsage, help ? stdout : stderr);
    return help ? 0 : 2;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return Launcher(std::move(options)).run();
}

}  // namespace zero3::cli

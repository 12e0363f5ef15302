// Bus bandwidth of all_gather_into, reduce_scatter and all_reduce per message size, nccl-tests style, against
// the bandwidth of the links the ring runs on, measured in the same run.
//
//   bench_collectives [--ranks 2,4] [--dtype f32|bf16|f16] [--min-bytes 4096] [--max-bytes 67108864]
//                     [--backend gloo]
//
// Started alone, it runs itself under `zero3 launch -n N` for each N in --ranks (the `zero3` binary beside
// it); under a launcher (zero3 launch, torchrun, mpirun, srun) it measures the job it is in.
//
// size is the large buffer of the collective (nccl-tests' convention): all_gather's output, reduce_scatter's
// input, all_reduce's buffer. time is the slowest rank's mean over a batch of iterations, the best of 5
// batches (a shared machine steals whole time slices from some of them). algbw = size/time;
// busbw = algbw * (N-1)/N for all_gather and reduce_scatter, * 2(N-1)/N for all_reduce: the bytes each link
// carries in a ring, so busbw compares across world sizes and against the link bound.
//
// Link bound: every rank streams 64 MiB to its right neighbour over a plain TCP socket while receiving from
// its left one, all at once, as in one ring step; the slowest rank's time gives the per-link GB/s. A ring
// collective cannot beat it; the ratio busbw/link says how much of the network the collective uses.
//
// The smallest run, in seconds (ctest label bench_smoke; tests/CMakeLists.txt reads these lines):
// zero3-bench-smoke: --ranks 2 --min-bytes 4096 --max-bytes 16384
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_main.hpp"
#include "comm/bootstrap/socket.hpp"
#include "zero3/comm.hpp"
#include "zero3/error.hpp"
#include "zero3/store.hpp"

using namespace zero3;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<int> ranks = {2, 4};
  DType dtype = DType::f32;
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{64} << 20;
  std::string backend = "gloo";
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_collectives: %s\nusage: bench_collectives [--ranks 2,4] [--dtype f32|bf16|f16] "
               "[--min-bytes N] [--max-bytes N] [--backend gloo]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--ranks") {
      o.ranks.clear();
      std::string list = next();
      for (size_t p = 0; p < list.size();) {
        size_t q = list.find(',', p);
        o.ranks.push_back(std::atoi(list.substr(p, q - p).c_str()));
        p = q == std::string::npos ? list.size() : q + 1;
      }
    } else if (a == "--dtype") {
      auto d = parse_dtype(next());
      if (!d) usage("unknown dtype");
      o.dtype = *d;
    } else if (a == "--min-bytes") {
      o.min_bytes = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--max-bytes") {
      o.max_bytes = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--backend") {
      o.backend = next();
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

// Runs this program under `zero3 launch -n N` for each N; returns the first failing status.
int relaunch(int argc, char** argv, const Options& o) {
  char self[4096];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) usage("cannot find this program's path");
  self[len] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));
  std::string zero3 = dir + "/zero3";
  int status = 0;
  for (int n : o.ranks) {
    std::vector<std::string> args = {zero3, "launch", "-n", std::to_string(n), "--", self};
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    std::vector<char*> cargs;
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::execv(cargs[0], cargs.data());
      std::perror(zero3.c_str());
      ::_exit(127);
    }
    int ws = 0;
    ::waitpid(pid, &ws, 0);
    int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    if (rc != 0 && status == 0) status = rc;
  }
  return status;
}

float slowest(Communicator& comm, float seconds) {
  comm.all_reduce(&seconds, 1, DType::f32, ReduceOp::max)->wait();
  return seconds;
}

// Per-link GB/s of a ring of plain TCP sockets, every link busy at once.
double link_bound(Communicator& comm, Store& store, const LaunchInfo& launch) {
  const int n = comm.size(), r = comm.rank();
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t alen = sizeof(a);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lfd, 4) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen) != 0) {
    throw CommError(std::string("bench link socket: ") + std::strerror(errno));
  }
  char host[256] = "127.0.0.1";
  bool one_node = launch.local_world_size == launch.world_size;
  if (!one_node) ::gethostname(host, sizeof(host) - 1);
  std::string mine = std::string(host) + " " + std::to_string(ntohs(a.sin_port));
  store.set("bench/link/" + std::to_string(r), std::vector<uint8_t>(mine.begin(), mine.end()));
  auto right_v = store.get("bench/link/" + std::to_string((r + 1) % n));
  std::string right(right_v.begin(), right_v.end());
  auto deadline = Clock::now() + std::chrono::seconds(60);
  bootstrap::Fd out = bootstrap::connect_once(right.substr(0, right.find(' ')),
                                              std::atoi(right.substr(right.find(' ') + 1).c_str()), deadline);
  bootstrap::Fd in(::accept(lfd, nullptr, nullptr));
  ::close(lfd);
  // Blocking sockets from here on.
  int flags = 0;
  ::ioctl(out.get(), FIONBIO, &flags);
  constexpr size_t kBytes = size_t{64} << 20, kChunk = size_t{1} << 20;
  std::vector<char> sendbuf(kChunk, 1), recvbuf(kChunk);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    auto t0 = Clock::now();
    std::thread sender([&] {
      for (size_t sent = 0; sent < kBytes;) {
        ssize_t k = ::send(out.get(), sendbuf.data(), std::min(kChunk, kBytes - sent), MSG_NOSIGNAL);
        if (k <= 0) throw CommError("bench link send failed");
        sent += static_cast<size_t>(k);
      }
    });
    for (size_t got = 0; got < kBytes;) {
      ssize_t k = ::recv(in.get(), recvbuf.data(), std::min(kChunk, kBytes - got), 0);
      if (k <= 0) throw CommError("bench link recv failed");
      got += static_cast<size_t>(k);
    }
    sender.join();
    float t = slowest(comm, std::chrono::duration<float>(Clock::now() - t0).count());
    best = std::min(best, static_cast<double>(t));
  }
  return kBytes / best / 1e9;
}

enum class Op { all_gather, reduce_scatter, all_reduce };
const char* op_name(Op op) {
  return op == Op::all_gather ? "all_gather" : op == Op::reduce_scatter ? "reduce_scatter" : "all_reduce";
}

// Seconds per operation: the slowest rank's mean over a batch, best of kBatches batches.
constexpr int kBatches = 5;
double time_op(Communicator& comm, Op op, size_t count, DType dtype, std::vector<uint8_t>& big,
               std::vector<uint8_t>& small) {
  auto once = [&] {
    switch (op) {
      case Op::all_gather:
        comm.all_gather_into(big.data(), small.data(), count, dtype)->wait();
        break;
      case Op::reduce_scatter:
        comm.reduce_scatter(small.data(), big.data(), count, dtype, ReduceOp::sum)->wait();
        break;
      case Op::all_reduce:
        comm.all_reduce(big.data(), count * static_cast<size_t>(comm.size()), dtype, ReduceOp::sum)->wait();
        break;
    }
  };
  once();
  once();
  // The probe (slowest rank) sets the batch size for everyone: about 0.05 s per batch, at least 3 operations.
  auto t0 = Clock::now();
  once();
  float probe = slowest(comm, std::chrono::duration<float>(Clock::now() - t0).count());
  int iters = std::clamp(static_cast<int>(0.05 / std::max(probe, 1e-6f)), 3, 1000);
  // Best of 5 batches: on a shared machine other processes steal whole time slices from some batches.
  double best = 1e30;
  for (int batch = 0; batch < kBatches; ++batch) {
    comm.barrier();
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) once();
    best = std::min(
        best, static_cast<double>(slowest(comm, std::chrono::duration<float>(Clock::now() - t0).count())) / iters);
  }
  return best;
}

int bench(const Options& o) {
  LaunchInfo launch = detect_launch();
  auto store = make_tcp_store(launch.master_addr, launch.store_port, launch.rank == 0, std::chrono::seconds(120));
  CommOptions copts;
  copts.backend = o.backend;
  copts.timeout = std::chrono::seconds(120);
  auto comm = make_communicator(copts, launch, store);
  const int n = comm->size();
  const bool root = comm->rank() == 0;
  const size_t esize = dtype_size(o.dtype);

  double link = n > 1 ? link_bound(*comm, *store, launch) : 0.0;
  if (root) {
    unsigned cores = std::thread::hardware_concurrency();
    std::printf("# zero3 bench_collectives: backend %s, %d ranks, dtype %s, %u CPU cores\n", comm->backend(), n,
                std::string(dtype_name(o.dtype)).c_str(), cores);
    if (n > 1) {
      std::printf(
          "# link bound: TCP ring, every rank sending 64 MiB to its right neighbour at once: %.2f GB/s per link\n",
          link);
    }
    std::printf("#\n# %12s %12s %-15s %12s %11s %11s %10s\n", "size_B", "count", "op", "time_us", "algbw_GB/s",
                "busbw_GB/s", "busbw/link");
  }
  double best[3] = {0, 0, 0};
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    size_t count = std::max<size_t>(1, bytes / (esize * static_cast<size_t>(n)));  // elements per rank
    size_t size = count * esize * static_cast<size_t>(n);
    std::vector<uint8_t> big(size, 0), small(count * esize, 0);
    for (Op op : {Op::all_gather, Op::reduce_scatter, Op::all_reduce}) {
      double t = time_op(*comm, op, count, o.dtype, big, small);
      double algbw = size / t / 1e9;
      double factor = op == Op::all_reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
      double busbw = algbw * factor;
      best[static_cast<int>(op)] = std::max(best[static_cast<int>(op)], busbw);
      if (root) {
        std::printf("  %12zu %12zu %-15s %12.1f %11.3f %11.3f %10s\n", size, count, op_name(op), t * 1e6, algbw, busbw,
                    n > 1 ? (std::to_string(busbw / link).substr(0, 4)).c_str() : "-");
      }
    }
    std::fflush(stdout);
  }
  if (root && n > 1) {
    std::printf(
        "# peak busbw: all_gather %.3f GB/s (%.2f of link), reduce_scatter %.3f GB/s (%.2f), all_reduce %.3f GB/s "
        "(%.2f)\n",
        best[0], best[0] / link, best[1], best[1] / link, best[2], best[2] / link);
  }
  comm.reset();
  return 0;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (detect_launch().launcher == "single") return relaunch(argc, argv, o);
  return bench(o);
}

int main(int argc, char** argv) { return zero3::testing::run_main(argc, argv, bench_main); }

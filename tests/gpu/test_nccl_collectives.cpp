// The NCCL communicator on a real GPU, through the public API (make_communicator with backend "nccl").
//
// One rank: every collective and dtype, in and out of place, on a user stream, and the watchdog turning a
// collective stuck behind a blocked stream into a TimeoutError that names it.
//
// Several ranks on one GPU: the test starts copies of itself (one process per rank, meeting through zero3's
// TCP store). NCCL before 2.30 refuses two ranks of a communicator on one GPU ("Duplicate GPU detected"), so
// each process gets its own NCCL_HOSTID: NCCL then takes them for different hosts and connects them over its
// network transport, which also lets the "socket" case prove through NCCL's own log ("via NET/Socket") that
// the network is pinned. Inputs are crafted so results are exact (rank r contributes r+1).
//
// Without a CUDA device (or in a build without NCCL) the program prints why and exits 77 (ctest: skipped).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "zero3/build_config.hpp"

#if ZERO3_HAVE_NCCL && ZERO3_HAVE_CUDA

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/store.hpp"

extern char** environ;

using namespace zero3;
namespace fs = std::filesystem;

namespace {

class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::printf("skipped: no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
      std::fflush(stdout);
      std::exit(77);
    }
  }
};
const auto* const kGpu = ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

#define CUDA_OK(stmt) ASSERT_EQ((stmt), cudaSuccess) << #stmt << ": " << cudaGetErrorString(cudaGetLastError())

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const DType kDTypes[] = {DType::f32, DType::bf16, DType::f16};

// Host floats <-> device elements of `dtype` (values chosen to be exact in every dtype).
class DeviceArray {
 public:
  DeviceArray(DType dtype, size_t n) : dtype_(dtype), n_(n) {
    if (cudaMalloc(&ptr_, std::max<size_t>(1, n * dtype_size(dtype))) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void* data() { return ptr_; }
  void* at(size_t i) { return static_cast<char*>(ptr_) + i * dtype_size(dtype_); }
  size_t size() const { return n_; }

  void upload(const std::vector<float>& v) {
    std::vector<uint8_t> bytes(v.size() * dtype_size(dtype_));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype_ == DType::f32) {
        std::memcpy(&bytes[i * 4], &v[i], 4);
      } else {
        uint16_t h = dtype_ == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
    if (cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) std::abort();
  }
  std::vector<float> download() {
    std::vector<uint8_t> bytes(n_ * dtype_size(dtype_));
    if (cudaMemcpy(bytes.data(), ptr_, bytes.size(), cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
    std::vector<float> v(n_);
    for (size_t i = 0; i < n_; ++i) {
      if (dtype_ == DType::f32) {
        std::memcpy(&v[i], &bytes[i * 4], 4);
      } else {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        v[i] = dtype_ == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return v;
  }

 private:
  DType dtype_;
  size_t n_;
  void* ptr_ = nullptr;
};

CommOptions nccl_options(std::chrono::milliseconds timeout, const std::string& network = "auto") {
  CommOptions o;
  o.backend = "nccl";
  o.device = 0;
  o.timeout = timeout;
  o.network = network;
  return o;
}

// ---------------------------------------------------------------------------------------------------------
// The collectives of one rank of `comm`, with crafted inputs; n = comm.size(). Fails through gtest.
void check_collectives(Communicator& comm, Stream stream) {
  const int n = comm.size(), r = comm.rank();
  const size_t count = 1001;  // odd, so no accidental alignment to anything
  for (DType dt : kDTypes) {
    SCOPED_TRACE(std::string("dtype ") + std::string(dtype_name(dt)));
    // all_reduce: rank r holds (r+1) * k, k = i%7 + 1.
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      SCOPED_TRACE(std::string("op ") + reduce_op_name(op));
      DeviceArray buf(dt, count);
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((r + 1) * (i % 7 + 1));
      buf.upload(in);
      auto work = comm.all_reduce(buf.data(), count, dt, op, stream);
      work->wait();
      EXPECT_TRUE(work->is_completed());
      auto out = buf.download();
      const float tri = n * (n + 1) / 2.0f;
      for (size_t i = 0; i < count; ++i) {
        float k = static_cast<float>(i % 7 + 1);
        float want = op == ReduceOp::sum ? tri * k : op == ReduceOp::max ? n * k : tri * k / n;
        // NCCL's avg multiplies by 1/n in the dtype: exact for n a power of two, rounded otherwise.
        float tol = (op == ReduceOp::avg && (n & (n - 1)) != 0) ? (dt == DType::f32 ? 1e-5f : 2e-2f) * want : 0.0f;
        ASSERT_NEAR(out[i], want, tol) << "element " << i;
      }
    }
    // all_gather_into, out of place and in place: rank q's slice is q*100 + i%50.
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "out of place");
      DeviceArray out(dt, count * n), src(dt, count);
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(r * 100 + i % 50);
      void* in_ptr = src.data();
      if (in_place) {
        std::vector<float> full(count * n, -1.0f);
        std::copy(mine.begin(), mine.end(), full.begin() + r * count);
        out.upload(full);
        in_ptr = out.at(r * count);
      } else {
        src.upload(mine);
      }
      comm.all_gather_into(out.data(), in_ptr, count, dt, stream)->wait();
      auto got = out.download();
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[q * count + i], static_cast<float>(q * 100 + i % 50)) << "slice " << q << " element " << i;
        }
      }
    }
    // reduce_scatter (sum, avg), out of place and in place: rank q's element g is (q+1) * (g%5 + 1).
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(reduce_op_name(op)) + (in_place ? " in place" : " out of place"));
        DeviceArray in(dt, count * n), out(dt, count);
        std::vector<float> v(count * n);
        for (size_t g = 0; g < v.size(); ++g) v[g] = static_cast<float>((r + 1) * (g % 5 + 1));
        in.upload(v);
        void* out_ptr = in_place ? in.at(r * count) : out.data();
        comm.reduce_scatter(out_ptr, in.data(), count, dt, op, stream)->wait();
        std::vector<float> got = in_place ? in.download() : out.download();
        if (in_place) got = std::vector<float>(got.begin() + r * count, got.begin() + (r + 1) * count);
        const float tri = n * (n + 1) / 2.0f;
        for (size_t i = 0; i < count; ++i) {
          float k = static_cast<float>((r * count + i) % 5 + 1);
          float want = op == ReduceOp::sum ? tri * k : tri * k / n;
          float tol = (op == ReduceOp::avg && (n & (n - 1)) != 0) ? (dt == DType::f32 ? 1e-5f : 2e-2f) * want : 0.0f;
          ASSERT_NEAR(got[i], want, tol) << "element " << i;
        }
      }
    }
    // broadcast from the last rank.
    {
      DeviceArray buf(dt, count);
      std::vector<float> v(count, 0.0f);
      if (r == n - 1) {
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(7 + i % 3);
      }
      buf.upload(v);
      comm.broadcast(buf.data(), count, dt, n - 1, stream)->wait();
      auto got = buf.download();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<float>(7 + i % 3)) << "element " << i;
    }
  }
  comm.barrier();

  // Argument errors are caught before NCCL sees them.
  EXPECT_THROW(comm.reduce_scatter(nullptr, nullptr, 4, DType::f32, ReduceOp::sum, stream), InvalidArgument);
  DeviceArray one(DType::f32, 4);
  EXPECT_THROW(comm.reduce_scatter(one.data(), one.data(), 1, DType::f32, ReduceOp::max, stream), InvalidArgument);
  EXPECT_THROW(comm.broadcast(one.data(), 4, DType::f32, n, stream), InvalidArgument);
  // count 0 is a completed no-op.
  EXPECT_TRUE(comm.all_reduce(one.data(), 0, DType::f32, ReduceOp::sum, stream)->is_completed());
}

// split(color = rank % 2, key = -rank): each half, ordered by descending world rank.
void check_split(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  auto child = comm.split(r % 2, -r);
  ASSERT_NE(child, nullptr);
  int members = 0, before_me = 0;
  for (int q = 0; q < n; ++q) {
    if (q % 2 != r % 2) continue;
    ++members;
    if (q > r) ++before_me;  // larger world rank = smaller key = earlier
  }
  EXPECT_EQ(child->size(), members);
  EXPECT_EQ(child->rank(), before_me);
  EXPECT_STREQ(child->backend(), "nccl");
  DeviceArray buf(DType::f32, 3);
  buf.upload({1.0f, 2.0f, static_cast<float>(r)});
  child->all_reduce(buf.data(), 3, DType::f32, ReduceOp::sum, nullptr)->wait();
  auto got = buf.download();
  EXPECT_EQ(got[0], static_cast<float>(members));
  EXPECT_EQ(got[1], 2.0f * members);
  float rank_sum = 0;
  for (int q = r % 2; q < n; q += 2) rank_sum += q;
  EXPECT_EQ(got[2], rank_sum);
  EXPECT_EQ(comm.split(-1, 0), nullptr) << "NCCL_SPLIT_NOCOLOR gives no communicator";
}

// ---------------------------------------------------------------------------------------------------------
// One rank.

TEST(NcclOneRank, EveryCollectiveAndDtype) {
  LaunchInfo one;
  auto comm = make_communicator(nccl_options(std::chrono::seconds(60)), one, nullptr);
  ASSERT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  check_collectives(*comm, reinterpret_cast<Stream>(stream));
  check_collectives(*comm, nullptr);  // the legacy default stream
  check_split(*comm);
  CUDA_OK(cudaStreamDestroy(stream));
}

std::atomic<bool> g_release{false};

void CUDART_CB block_stream(void*) {
  // Holds the stream (and so the collective queued behind it) until the test releases it; bounded so that a
  // broken test cannot hang the GPU.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!g_release.load() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(NcclOneRank, WatchdogTimesOutAStuckCollectiveAndAborts) {
  LaunchInfo one;
  auto comm = make_communicator(nccl_options(std::chrono::seconds(1)), one, nullptr);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceArray buf(DType::bf16, 4096);
  g_release = false;
  CUDA_OK(cudaLaunchHostFunc(stream, block_stream, nullptr));
  auto start = std::chrono::steady_clock::now();
  auto work = comm->all_reduce(buf.data(), 4096, DType::bf16, ReduceOp::sum, reinterpret_cast<Stream>(stream));
  EXPECT_FALSE(work->wait_for(std::chrono::milliseconds(100)));
  try {
    work->wait();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_TRUE(contains(m, "all_reduce(count=4096, dtype=bf16, op=sum) on rank 0 of 1")) << m;
    EXPECT_TRUE(contains(m, "did not complete within 1 s")) << m;
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 10.0) << "the watchdog polls at least every 100 ms";
  g_release = true;
  try {
    comm->all_reduce(buf.data(), 1, DType::bf16, ReduceOp::sum, reinterpret_cast<Stream>(stream));
    FAIL() << "expected CommError after the abort";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "aborted earlier")) << e.what();
  }
  EXPECT_TRUE(work->is_completed());
  comm.reset();
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------------------
// Several ranks on one GPU: the parent starts one child process per rank.

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct ChildRun {
  int status = -1;
  std::string log;
};

// Runs this program's NcclChild test as `n` ranks with `scenario` and `network`; returns each rank's exit
// status and output.
std::vector<ChildRun> run_ranks(int n, const std::string& scenario, const std::string& network,
                                const std::vector<std::string>& extra_env = {}) {
  int port = free_port();
  fs::path dir = fs::temp_directory_path() / ("zero3_nccl_test_" + std::to_string(getpid()) + "_" + scenario);
  fs::create_directories(dir);
  std::vector<pid_t> pids(n, -1);
  std::vector<ChildRun> runs(n);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back("ZERO3_NCCL_TEST_RANK=" + std::to_string(r));
    env.push_back("ZERO3_NCCL_TEST_WORLD=" + std::to_string(n));
    env.push_back("ZERO3_NCCL_TEST_PORT=" + std::to_string(port));
    env.push_back("ZERO3_NCCL_TEST_SCENARIO=" + scenario);
    env.push_back("ZERO3_NCCL_TEST_NETWORK=" + network);
    env.push_back("NCCL_HOSTID=zero3-test-host-" + std::to_string(r));  // see the file comment
    for (const auto& e : extra_env) env.push_back(e);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string exe = fs::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=NcclChild.Rank";
    std::vector<char*> argv = {exe.data(), filter.data(), nullptr};
    std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pids[r], exe.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0) pids[r] = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0 || runs[r].status != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        runs[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] > 0 && runs[r].status == -1) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          runs[r].status = 999;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".log"));
    std::stringstream ss;
    ss << in.rdbuf();
    runs[r].log = ss.str();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return runs;
}

void expect_all_passed(const std::vector<ChildRun>& runs) {
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].status, 0) << "rank " << r << " output:\n" << runs[r].log;
  }
}

TEST(NcclRanksOnOneGpu, TwoRanks) { expect_all_passed(run_ranks(2, "collectives", "auto")); }

TEST(NcclRanksOnOneGpu, ThreeRanks) { expect_all_passed(run_ranks(3, "collectives", "auto")); }

TEST(NcclRanksOnOneGpu, SocketNetworkIsPinnedAndNcclSaysSo) {
  auto runs = run_ranks(2, "collectives", "socket", {"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"});
  expect_all_passed(runs);
  EXPECT_TRUE(contains(runs[0].log, "NCCL network: TCP sockets (zero3.network = \"socket\")")) << runs[0].log;
  bool via_socket = contains(runs[0].log + runs[1].log, "via NET/Socket");
  EXPECT_TRUE(via_socket) << "NCCL's INFO log does not show the socket transport:\n" << runs[0].log;
}

TEST(NcclRanksOnOneGpu, MissingPeerTimesOutWithTheCollectiveNamed) {
  auto runs = run_ranks(2, "missing-peer", "auto");
  expect_all_passed(runs);
}

// The body of one rank (runs only in the child processes).
TEST(NcclChild, Rank) {
  const char* rank_env = std::getenv("ZERO3_NCCL_TEST_RANK");
  if (!rank_env) GTEST_SKIP() << "runs as a child of the NcclRanksOnOneGpu tests";
  const int rank = std::atoi(rank_env);
  const int world = std::atoi(std::getenv("ZERO3_NCCL_TEST_WORLD"));
  const int port = std::atoi(std::getenv("ZERO3_NCCL_TEST_PORT"));
  const std::string scenario = std::getenv("ZERO3_NCCL_TEST_SCENARIO");
  const std::string network = std::getenv("ZERO3_NCCL_TEST_NETWORK");

  LaunchInfo launch;
  launch.rank = rank;
  launch.world_size = world;
  launch.local_rank = rank;
  launch.local_world_size = world;
  launch.master_port = port;
  launch.launcher = "test";
  auto store = make_tcp_store("127.0.0.1", port, rank == 0, std::chrono::seconds(60));
  const bool missing_peer = scenario == "missing-peer";
  auto comm = make_communicator(nccl_options(std::chrono::seconds(missing_peer ? 3 : 120), network), launch, store);
  ASSERT_EQ(comm->rank(), rank);
  ASSERT_EQ(comm->size(), world);

  if (!missing_peer) {
    check_collectives(*comm, nullptr);
    check_split(*comm);
    comm->barrier();
    return;
  }
  // Rank 1 never joins the all_reduce; rank 0's watchdog must end it within the 3 s timeout.
  DeviceArray buf(DType::f32, 256);
  if (rank == 0) {
    auto start = std::chrono::steady_clock::now();
    try {
      comm->all_reduce(buf.data(), 256, DType::f32, ReduceOp::sum, nullptr)->wait();
      FAIL() << "expected TimeoutError";
    } catch (const TimeoutError& e) {
      std::string m = e.what();
      EXPECT_TRUE(contains(m, "all_reduce(count=256, dtype=f32, op=sum) on rank 0 of 2")) << m;
      EXPECT_TRUE(contains(m, "did not complete within 3 s")) << m;
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited, 30.0);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(6));
  }
}

}  // namespace

#else  // no NCCL in this build

namespace {
class NoNccl : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("skipped: this build of zero3 has no NCCL backend (ZERO3_CUDA/ZERO3_NCCL off or not found)\n");
    std::fflush(stdout);
    std::exit(77);
  }
};
const auto* const kNoNccl = ::testing::AddGlobalTestEnvironment(new NoNccl);
}  // namespace

TEST(Nccl, NotInThisBuild) {}

#endif

// The ZeRO engine on the GPU: the cuda device with the NCCL communicator, trained like the dist equivalence
// tests (support/mlp_trainer.hpp: 10 optimizer steps, gradient accumulation 2, AdamW, clipping, WarmupLR)
// and compared with the unsharded single-process reference, with the same bounds (fp32 1e-5 relative;
// bf16 5e-3 and fp16 1e-3, justified in tests/dist/test_equivalence.cpp). The layers' arithmetic runs on
// the host over copies of the device views; everything the engine does (gathers on the gather stream,
// reductions on the reduce stream, the optimizer and the statistics) runs on the GPU.
//
// One rank: stages 0-3 and the 16-bit variants. Several ranks on one GPU: the test starts one process per
// rank, meeting through zero3's TCP store, each with its own NCCL_HOSTID (NCCL before 2.30 refuses two
// ranks of a communicator on one GPU; as different "hosts" they connect over NCCL's network transport).
// Memory: gathered parameters are freed after use (step() leaves only the next micro-step's first units gathered),
// the live-parameter cap holds, and the device's byte count equals the engine's own accounting.
// Offload (ZeRO-Offload / ZeRO-Infinity on the GPU): optimizer offload to pinned and pageable host memory and
// to NVMe, parameter offload to host memory and NVMe, alone and together, on one rank and on several, against
// the same reference; the master and moments leave the device, whose byte count drops by what moved.
#include "gpu/cuda_test_env.hpp"

#if ZERO3_HAVE_CUDA && ZERO3_HAVE_NCCL

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/boundary_prefetch.hpp"
#include "support/engine_world.hpp"
#include "support/mlp_trainer.hpp"
#include "support/rank_temp_dir.hpp"
#include "support/reference_model.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"
#include "zero3/store.hpp"

extern char** environ;

namespace zero3 {
namespace {

using namespace zero3::testing;
namespace fs = std::filesystem;

struct Variant {
  std::string name;
  int stage;
  std::function<void(Config&)> change;
  double tolerance;
};

const Variant kVariants[] = {
    {"stage0", 0, nullptr, 1e-5},
    {"stage1", 1, nullptr, 1e-5},
    {"stage2", 2, nullptr, 1e-5},
    {"stage3", 3, nullptr, 1e-5},
    {"stage3_bf16", 3, [](Config& c) { c.bf16.enabled = true; }, 5e-3},
    {"stage2_fp16", 2,
     [](Config& c) {
       c.fp16.enabled = true;
       c.fp16.initial_scale_power = 8;
     },
     1e-3},
};

// The swap directory of this process's NVMe variants (removed at exit).
const std::string& swap_dir() {
  static RankTempDir dir;
  return dir.path();
}

void offload(Config& c, OffloadDevice optimizer, OffloadDevice param, bool pin = true) {
  c.zero.offload_optimizer.device = optimizer;
  c.zero.offload_optimizer.pin_memory = pin;
  c.zero.offload_param.device = param;
  c.zero.offload_param.pin_memory = pin;
  if (optimizer == OffloadDevice::nvme) c.zero.offload_optimizer.nvme_path = swap_dir();
  if (param == OffloadDevice::nvme) {
    c.zero.offload_param.nvme_path = swap_dir();
    c.zero.offload_param.buffer_size = 100'000;
  }
}

// bf16 bounds as above; several tiles per unit where sub_group_size is set.
const Variant kOffloadVariants[] = {
    {"stage2_optimizer_cpu_bf16_tiles", 2,
     [](Config& c) {
       c.bf16.enabled = true;
       c.zero.sub_group_size = 17;
       offload(c, OffloadDevice::cpu, OffloadDevice::none);
     },
     5e-3},
    {"stage1_optimizer_cpu_pageable", 1,
     [](Config& c) { offload(c, OffloadDevice::cpu, OffloadDevice::none, /*pin=*/false); }, 1e-5},
    {"stage3_optimizer_nvme_tiles", 3,
     [](Config& c) {
       c.zero.sub_group_size = 33;
       offload(c, OffloadDevice::nvme, OffloadDevice::none);
     },
     1e-5},
    {"stage3_param_cpu_bf16", 3,
     [](Config& c) {
       c.bf16.enabled = true;
       offload(c, OffloadDevice::none, OffloadDevice::cpu);
     },
     5e-3},
    {"stage3_both_cpu_bf16", 3,  // the seed's Llama-3-8B setting
     [](Config& c) {
       c.bf16.enabled = true;
       offload(c, OffloadDevice::cpu, OffloadDevice::cpu);
     },
     5e-3},
    {"stage3_both_nvme_bf16_tiles", 3,
     [](Config& c) {
       c.bf16.enabled = true;
       c.zero.sub_group_size = 23;
       offload(c, OffloadDevice::nvme, OffloadDevice::nvme);
     },
     5e-3},
};

// Trains `v` on `comm` with the cuda device and compares with the reference; gtest expectations.
void train_and_compare(const Variant& v, std::shared_ptr<Communicator> comm, Device& device) {
  Config c = equivalence_config(v.stage);
  c.communication_data_type = DType::f32;  // exact sums, as the reference's: the 16-bit bounds below
  if (v.change) v.change(c);
  TrainPlan plan;
  plan.world = comm->size();
  plan.steps = 10;
  Engine engine(resolved_for(c, *comm), comm, device);
  MlpUnits units = declare_mlp(engine, plan.dims);
  engine.materialize();
  EngineRun run = train_mlp(engine, units, plan);
  ReferenceRun ref = run_reference(c, plan);
  const int rank = comm->rank();
  const int64_t gas = engine.gradient_accumulation_steps();
  ASSERT_EQ(static_cast<int64_t>(run.losses.size()), plan.steps * gas);
  for (int64_t t = 0; t < plan.steps; ++t) {
    for (int64_t k = 0; k < gas; ++k) {
      double want = ref.losses[static_cast<size_t>(t)][static_cast<size_t>(k)][static_cast<size_t>(rank)];
      EXPECT_NEAR(run.losses[static_cast<size_t>(t * gas + k)], want, v.tolerance * std::fabs(want))
          << v.name << ": rank " << rank << ", step " << t << ", micro-step " << k;
    }
    const StepResult& r = run.steps[static_cast<size_t>(t * gas + gas - 1)];
    EXPECT_TRUE(r.applied) << v.name << ": step " << t;
    EXPECT_NEAR(r.grad_norm, ref.grad_norms[static_cast<size_t>(t)],
                v.tolerance * ref.grad_norms[static_cast<size_t>(t)])
        << v.name << ": step " << t;
    EXPECT_NEAR(r.lr, ref.lrs[static_cast<size_t>(t)], 1e-9) << v.name << ": step " << t;
  }
  std::string worst;
  double err = max_relative_error(run.params, ref.params, &worst);
  EXPECT_LE(err, v.tolerance) << v.name << ": largest weight difference at " << worst;
}

TEST(CudaEngine, OneRankWithNcclEqualsTheReference) {
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  ASSERT_STREQ(comm->backend(), "nccl");
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    train_and_compare(v, comm, *device);
    EXPECT_EQ(device->bytes_in_use(), 0) << v.name << ": the engine left device memory behind";
  }
}

// The caller's stream (make_device("cuda", stream), as a framework with its own stream would): a non-blocking
// stream, which nothing on CUDA's legacy default stream waits for; the engine computes there and gives the
// reference's numbers. (That none of its work lands on the legacy default stream is proven on the CPU, where
// the stream-path device tells the streams apart: tests/dist/test_engine_stream_path.cpp.)
TEST(CudaEngine, OnTheCallersStreamEqualsTheReference) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    auto device = make_device("cuda", stream);
    ASSERT_EQ(device->default_stream(), stream);
    auto comm = nccl_world_of_one();
    for (const Variant& v : {kVariants[3], kVariants[4], kOffloadVariants[4]}) {
      SCOPED_TRACE(v.name);
      train_and_compare(v, comm, *device);
      EXPECT_EQ(device->bytes_in_use(), 0) << v.name << ": the engine left device memory behind";
    }
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaEngine, OffloadOneRankEqualsTheReference) {
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  for (const Variant& v : kOffloadVariants) {
    SCOPED_TRACE(v.name);
    train_and_compare(v, comm, *device);
    EXPECT_EQ(device->bytes_in_use(), 0) << v.name << ": the engine left device memory behind";
  }
}

// The seed's setting (stage 3, bf16, optimizer and parameters offloaded to pinned host memory): the master,
// the moments and the parameter slices leave the device, which holds exactly what the engine counts.
TEST(CudaEngine, OffloadMovesTheStateOffTheDevice) {
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  Config plain = equivalence_config(3);
  plain.bf16.enabled = true;
  Config off = plain;
  offload(off, OffloadDevice::cpu, OffloadDevice::cpu);
  TrainPlan plan;
  plan.world = 1;
  plan.steps = 2;
  MemoryStats without, with;
  for (Config* c : {&plain, &off}) {
    Engine engine(resolved_for(*c, *comm), comm, *device);
    MlpUnits units = declare_mlp(engine, plan.dims);
    engine.materialize();
    train_mlp(engine, units, plan);
    MemoryStats m = engine.memory();
    EXPECT_EQ(device->bytes_in_use(), m.total()) << "the device holds exactly what the engine accounts for";
    (c == &plain ? without : with) = m;
  }
  EXPECT_EQ(with.master, 0);
  EXPECT_EQ(with.optimizer_state, 0);
  EXPECT_EQ(with.host_master, without.master);
  EXPECT_EQ(with.host_optimizer_state, without.optimizer_state);
  EXPECT_GT(with.host_params, 0);
  // The device lost the master, the moments and the bf16 slices (persistent units stay gathered).
  EXPECT_EQ(without.total() - with.total(), with.host_master + with.host_optimizer_state + with.host_params);
}

TEST(CudaEngine, GatheredParametersAreFreedAndTheLiveCapHolds) {
  auto device = make_device("cuda");
  auto comm = nccl_world_of_one();
  Config c = equivalence_config(3);
  c.zero.param_persistence_threshold = 0;  // every unit is gathered on use
  TrainPlan plan;
  plan.world = 1;
  plan.steps = 3;
  Engine engine(resolved_for(c, *comm), comm, *device);
  MlpUnits units = declare_mlp(engine, plan.dims);
  int64_t largest = 0, total = 0;
  for (size_t u = 0; u < engine.num_units(); ++u) {
    largest = std::max(largest, engine.unit(UnitId{static_cast<int32_t>(u)}).numel);
    total += engine.unit(UnitId{static_cast<int32_t>(u)}).numel;
  }
  engine.materialize();
  const int64_t resident = device->bytes_in_use();
  EXPECT_EQ(resident, engine.memory().total()) << "the device holds exactly what the engine accounts for";
  for (int64_t step = 0; step < plan.steps; ++step) {
    for (int64_t micro = 0; micro < engine.gradient_accumulation_steps(); ++micro) {
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, 2, 0, 1), plan.micro_batch);
      mlp_micro_step(engine, units, plan.dims, b);
      engine.step();
      // Only the next micro-step's first units stay gathered (ahead, or kept within the accumulation window).
      EXPECT_EQ(engine.memory().gathered, gathered_bytes(engine, next_micro_step_first_units(engine)))
          << "gathered units other than the next micro-step's first ones still held after the micro-step";
      EXPECT_EQ(device->bytes_in_use(), engine.memory().total());
    }
  }
  EXPECT_GT(engine.memory().peak_gathered, 0);
  ScheduleStats s = engine.schedule_stats();
  EXPECT_GT(s.all_gathers, 0);
  int64_t ahead = 0;
  for (UnitId id : next_micro_step_first_units(engine)) ahead += engine.unit(id).numel;
  EXPECT_GT(ahead, 0);
  EXPECT_EQ(s.live_numel, ahead);
  EXPECT_LE(s.peak_live_numel, total);

  // With stage3_max_live_parameters at the largest unit, at most that many elements are ever gathered.
  Config capped = equivalence_config(3);
  capped.zero.param_persistence_threshold = 0;
  capped.zero.max_live_parameters = largest;
  Engine engine2(resolved_for(capped, *comm), comm, *device);
  MlpUnits units2 = declare_mlp(engine2, plan.dims);
  engine2.materialize();
  for (int64_t step = 0; step < 2; ++step) {
    for (int64_t micro = 0; micro < engine2.gradient_accumulation_steps(); ++micro) {
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, 2, 0, 1), plan.micro_batch);
      mlp_micro_step(engine2, units2, plan.dims, b);
      engine2.step();
    }
  }
  EXPECT_LE(engine2.schedule_stats().peak_live_numel, largest);
  EXPECT_LE(engine2.memory().peak_gathered, largest * static_cast<int64_t>(sizeof(float)));
}

// ---------------------------------------------------------------------------------------------------------
// Several ranks on one GPU: the parent starts one child process per rank.

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Runs the CudaEngineChild test as `n` ranks; returns each rank's exit status and output.
std::vector<std::pair<int, std::string>> run_ranks(int n) {
  const int port = free_port();
  fs::path dir =
      fs::temp_directory_path() / ("zero3_cuda_engine_" + std::to_string(getpid()) + "_" + std::to_string(n));
  fs::create_directories(dir);
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  std::vector<std::pair<int, std::string>> out(static_cast<size_t>(n), {-1, ""});
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back("ZERO3_CUDA_ENGINE_RANK=" + std::to_string(r));
    env.push_back("ZERO3_CUDA_ENGINE_WORLD=" + std::to_string(n));
    env.push_back("ZERO3_CUDA_ENGINE_PORT=" + std::to_string(port));
    env.push_back("NCCL_HOSTID=zero3-engine-host-" + std::to_string(r));  // see the file comment
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=CudaEngineChild.Rank";
    std::string self = exe;
    std::vector<char*> argv = {self.data(), filter.data(), nullptr};
    std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pids[static_cast<size_t>(r)], exe.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0) {
      pids[static_cast<size_t>(r)] = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      auto& [status, log] = out[static_cast<size_t>(r)];
      pid_t pid = pids[static_cast<size_t>(r)];
      if (pid <= 0 || status != -1) {
        if (pid <= 0 && status == -1) {
          status = 998;
          --left;
        }
        continue;
      }
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (pids[static_cast<size_t>(r)] > 0 && out[static_cast<size_t>(r)].first == -1) {
          kill(pids[static_cast<size_t>(r)], SIGKILL);
          waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
          out[static_cast<size_t>(r)].first = 999;
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
    out[static_cast<size_t>(r)].second = ss.str();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return out;
}

TEST(CudaEngine, TwoRanksOnOneGpuEqualTheReference) {
  auto runs = run_ranks(2);
  for (size_t r = 0; r < runs.size(); ++r) EXPECT_EQ(runs[r].first, 0) << "rank " << r << ":\n" << runs[r].second;
}

TEST(CudaEngine, ThreeRanksOnOneGpuEqualTheReference) {
  auto runs = run_ranks(3);
  for (size_t r = 0; r < runs.size(); ++r) EXPECT_EQ(runs[r].first, 0) << "rank " << r << ":\n" << runs[r].second;
}

// The body of one rank (runs only in the child processes).
TEST(CudaEngineChild, Rank) {
  const char* rank_env = std::getenv("ZERO3_CUDA_ENGINE_RANK");
  if (!rank_env) GTEST_SKIP() << "runs as a child of the CudaEngine several-ranks tests";
  LaunchInfo launch;
  launch.rank = std::atoi(rank_env);
  launch.world_size = std::atoi(std::getenv("ZERO3_CUDA_ENGINE_WORLD"));
  launch.local_rank = launch.rank;
  launch.local_world_size = launch.world_size;
  launch.master_port = std::atoi(std::getenv("ZERO3_CUDA_ENGINE_PORT"));
  launch.launcher = "test";
  auto store = make_tcp_store("127.0.0.1", launch.master_port, launch.rank == 0, std::chrono::seconds(60));
  auto comm = std::shared_ptr<Communicator>(make_communicator(nccl_options(), launch, store));
  ASSERT_EQ(comm->size(), launch.world_size);
  auto device = make_device("cuda");
  for (const Variant& v : kVariants) {
    if (v.stage < 2 && v.name != "stage1") continue;  // stage 1 (all-reduce path) and the sharded stages
    SCOPED_TRACE(v.name);
    train_and_compare(v, comm, *device);
  }
  for (const Variant& v : kOffloadVariants) {
    SCOPED_TRACE(v.name);
    train_and_compare(v, comm, *device);
  }
}

}  // namespace
}  // namespace zero3

#else

TEST(CudaEngine, NotInThisBuild) {}

#endif

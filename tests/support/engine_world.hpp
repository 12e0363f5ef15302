// The communicator of the engine's multi-rank tests: one per process, joined once through connect()
// (under `zero3 launch -n N`: Gloo; alone: the local world of one), with a timeout short enough that a
// broken test fails instead of hanging. These tests train on the cpu device, so they name a host backend:
// "auto" would pick nccl on a machine with a GPU, and nccl cannot reduce host memory.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"

namespace zero3::testing {

// Options for a communicator over host memory: gloo when this build has it, else what "auto" finds.
inline CommOptions host_comm_options(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  CommOptions o;
  o.timeout = timeout;
  const auto names = available_backends();
  if (std::find(names.begin(), names.end(), "gloo") != names.end()) o.backend = "gloo";
  return o;
}

// Options for nccl on GPU 0 (the GPU tests), and a world of that one rank, for tests that run alone.
inline CommOptions nccl_options() {
  CommOptions o;
  o.backend = "nccl";
  o.device = 0;
  o.timeout = std::chrono::seconds(120);
  return o;
}

inline std::shared_ptr<Communicator> nccl_world_of_one() {
  LaunchInfo launch;
  launch.rank = 0;
  launch.world_size = 1;
  launch.local_rank = 0;
  launch.local_world_size = 1;
  launch.launcher = "test";
  return std::shared_ptr<Communicator>(make_communicator(nccl_options(), launch, nullptr));
}

inline std::shared_ptr<Communicator> engine_world() {
  static std::shared_ptr<Communicator> world = [] {
    CommOptions o = host_comm_options();
    return std::shared_ptr<Communicator>(connect(o));
  }();
  return world;
}

// `config` resolved for `comm`'s world size, as the Engine requires (the tests build their configs in code).
inline Config resolved_for(Config config, const Communicator& comm) {
  ResolveInputs in;
  in.world_size = comm.size();
  resolve(config, in);
  return config;
}

// The launcher's nodes (`zero3 launch --simulate-nodes` or a real multi-node launch): ranks per node and nodes.
struct LauncherNodes {
  int per_node = 1;
  int count = 1;
};

inline LauncherNodes launcher_nodes() {
  const LaunchInfo launch = detect_launch();
  return {launch.local_world_size, launch.world_size / launch.local_world_size};
}

inline Device& cpu_device() {
  static std::unique_ptr<Device> device = make_cpu_device();
  return *device;
}

}  // namespace zero3::testing

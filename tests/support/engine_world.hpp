// The communicator of the engine's multi-rank tests: one per process, joined once through connect()
// (under `zero3 launch -n N`: Gloo; alone: the local world of one), with a timeout short enough that a
// broken test fails instead of hanging.
#pragma once

#include <chrono>
#include <memory>

#include "zero3/comm.hpp"
#include "zero3/device.hpp"

namespace zero3::testing {

inline std::shared_ptr<Communicator> engine_world() {
  static std::shared_ptr<Communicator> world = [] {
    CommOptions o;
    o.timeout = std::chrono::seconds(60);
    return std::shared_ptr<Communicator>(connect(o));
  }();
  return world;
}

inline Device& cpu_device() {
  static std::unique_ptr<Device> device = make_cpu_device();
  return *device;
}

}  // namespace zero3::testing

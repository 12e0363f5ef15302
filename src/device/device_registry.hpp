// The table of device kinds. Each backend registers a factory from its own folder (device/cpu,
// device/cuda) with a static DeviceRegistrar, so a build knows only the devices it compiled; make_device()
// looks names up here.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero3/device.hpp"

namespace zero3::detail {

// Makes device number `index` of this kind (0 for cpu), computing on `compute_stream` (nullptr: the kind's
// default; a kind without streams throws InvalidArgument for any other). Throws when it cannot.
using DeviceFactory = std::function<std::unique_ptr<Device>(int index, Stream compute_stream)>;
// Whether "auto" may pick this kind here (e.g. a CUDA device is present). Empty: always.
using DeviceUsable = std::function<bool()>;
// Makes device number `index` of this kind the calling thread's current one (cuda: cudaSetDevice), so that work
// launched without naming a device goes to it. Empty: the kind has no notion of a current device.
using DeviceActivate = std::function<void(int index)>;

void register_device(const std::string& kind, DeviceFactory factory, DeviceUsable usable = {},
                     DeviceActivate activate = {});

struct DeviceRegistrar {
  DeviceRegistrar(const char* kind, DeviceFactory factory, DeviceUsable usable = {}, DeviceActivate activate = {}) {
    register_device(kind, std::move(factory), std::move(usable), std::move(activate));
  }
};

// "auto" resolved the way make_device() resolves it ("cuda" when registered and usable, else "cpu"); any other
// name is returned as it is.
std::string resolve_device_kind(const std::string& kind);

// Runs the kind's DeviceActivate for `index` (nothing for a kind without one). Throws what it throws.
void activate_device(const std::string& kind, int index);

// Registered kinds, sorted.
std::vector<std::string> registered_devices();

}  // namespace zero3::detail

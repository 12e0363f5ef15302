// zero3::initialize(): config -> device choice -> communicator -> resolved config -> engine.
#include "zero3/initialize.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "device/device_registry.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

struct DeviceChoice {
  std::string kind;  // "cpu" or "cuda"
  int index = 0;     // the GPU, for cuda
};

DeviceChoice choose_device(const std::string& requested, const std::string& origin, const LaunchInfo& launch) {
  std::string kind = requested;
  int index = -1;
  if (auto colon = requested.find(':'); colon != std::string::npos) {
    kind = requested.substr(0, colon);
    const std::string digits = requested.substr(colon + 1);
    if (kind != "cuda" || digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw InvalidArgument(origin + ": \"" + requested + "\" is not a device (expected cpu, cuda, cuda:N or auto)");
    }
    index = std::stoi(digits);
  }
  if (kind != "cpu" && kind != "cuda" && kind != "auto") {
    throw InvalidArgument(origin + ": \"" + requested + "\" is not a device (expected cpu, cuda, cuda:N or auto)");
  }
  DeviceChoice c;
  c.kind = detail::resolve_device_kind(kind);
  const std::vector<std::string> built = detail::registered_devices();
  if (std::find(built.begin(), built.end(), c.kind) == built.end()) {
    throw Unsupported(origin + ": \"" + requested + "\": this build of zero3 has no CUDA device support");
  }
  c.index = c.kind == "cuda" ? (index >= 0 ? index : launch.local_rank) : 0;
  return c;
}

std::string choose_backend(const Config& config, const DeviceChoice& device, const LaunchInfo& launch) {
  const std::string& b = config.zero3.comm_backend;
  const bool gpu = device.kind == "cuda";
  if (b == "auto") return gpu ? "nccl" : launch.world_size == 1 ? "local" : "gloo";
  if ((b == "nccl") != gpu) {
    throw ConfigError("zero3.comm_backend: \"" + b + "\" with device " + device.kind +
                      (gpu ? ": the engine on a GPU communicates through nccl; expected \"nccl\" or \"auto\""
                           : ": nccl moves GPU memory only; expected \"gloo\" or \"auto\" on the cpu device"));
  }
  return b;
}

const char* network_name(NetworkTransport t) {
  return t == NetworkTransport::efa ? "efa" : t == NetworkTransport::socket ? "socket" : "auto";
}

}  // namespace

Session initialize(const std::string& config_path, const InitOptions& options) {
  log::set_rank(detect_launch().rank);  // the reader's warnings then come from rank 0 only
  return initialize(load_config(config_path), options);
}

Session initialize(Config config, const InitOptions& options) {
  Session s;
  s.launch = detect_launch();
  log::set_rank(s.launch.rank);

  const DeviceChoice device = options.device.empty() ? choose_device(config.zero3.device, "zero3.device", s.launch)
                                                     : choose_device(options.device, "InitOptions::device", s.launch);
  const std::string backend = choose_backend(config, device, s.launch);
  if (options.resolve.world_size && *options.resolve.world_size != s.launch.world_size) {
    throw InvalidArgument("initialize: ResolveInputs::world_size is " + std::to_string(*options.resolve.world_size) +
                          ", but the launcher started " + std::to_string(s.launch.world_size) +
                          " rank(s); leave it unset (the communicator's size is used)");
  }
  // Before the communicator's first CUDA call, so that no rank makes GPU 0 current by default.
  if (device.kind == "cuda") detail::activate_device("cuda", device.index);

  CommOptions co;
  co.backend = backend;
  co.timeout = std::chrono::seconds(config.zero3.comm_timeout_s);
  co.device = device.kind == "cuda" ? device.index : -1;
  co.network = network_name(config.zero3.network);
  co.register_buffers = config.zero3.nccl_register_buffers;
  if (backend != "nccl" && config.zero3.network != NetworkTransport::auto_detect) {
    log::warn_rank0("zero3.network \"", co.network, "\" chooses NCCL's transport; the ", backend,
                    " communicator does not use it (Gloo talks TCP; see GLOO_SOCKET_IFNAME)");
  }
  s.comm = connect(co);

  ResolveInputs in = options.resolve;
  in.world_size = s.comm->size();
  resolve(config, in);
  config.zero3.device = device.kind;
  s.config = std::move(config);

  s.device = make_device(device.kind == "cuda" ? "cuda:" + std::to_string(device.index) : "cpu");
  // A pipelined config: the stages' engines are the PipelineEngine's to make, over the groups it splits.
  if (s.config.pipeline.stages.value_or(1) == 1) s.engine = std::make_unique<Engine>(s.config, s.comm, *s.device);
  log::info_rank0("initialize: ", s.comm->size(), " rank(s) (", s.launch.launcher, "), device ", s.device->name(),
                  " on rank 0, communicator ", s.comm->backend(), " with a ", s.comm->timeout().count() / 1000,
                  " s timeout, ZeRO stage ", s.config.zero.stage, ", config ", s.config.source);
  return s;
}

}  // namespace zero3

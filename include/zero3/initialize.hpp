// One call from a DeepSpeed config to a running engine, in the spirit of deepspeed.initialize(): it joins the
// job, makes the device, resolves the config for the job's world size and creates the Engine, with the config's
// "zero3" section honoured (device, comm_backend, comm_timeout_s, network, nccl_register_buffers).
//
//   #include <zero3/zero3.hpp>
//
//   int main() {
//     zero3::InitOptions opts;
//     opts.resolve.hidden_size = 4096;  // what fills "auto", as Hugging Face's TrainingArguments do
//     opts.resolve.micro_batch = 4;
//     zero3::Session s = zero3::initialize("ds_config.json", opts);
//     zero3::Engine& engine = *s.engine;
//     // declare units, engine.materialize(), train: see engine.hpp
//   }
//
// To change keys of the file from the program (command-line flags), load it, edit the Config and pass that:
//
//   zero3::Config cfg = zero3::load_config("ds_config.json");
//   cfg.zero.stage = 2;                       // typed overrides; "auto" is still resolved afterwards
//   cfg.zero3.comm_timeout_s = 120;
//   zero3::Session s = zero3::initialize(std::move(cfg), opts);
//
// What initialize() does, in this order:
//   1. Device: InitOptions::device when set, else zero3.device. "auto" is cuda when this build has CUDA and a
//      GPU is usable, else cpu. On cuda each rank takes GPU LOCAL_RANK (the launcher's local rank) unless the
//      name is "cuda:N", and that GPU becomes the calling thread's current CUDA device before anything else
//      touches CUDA, so that the legacy default stream the engine orders its work against, and kernels launched
//      without naming a device, are on it.
//   2. Communicator: connect() (detect_launch(), zero3's TCP store) with zero3.comm_backend ("auto": nccl on
//      cuda; on cpu, local for a job of one process, else gloo), zero3.comm_timeout_s (ZERO3_COMM_TIMEOUT_S, when
//      set, still overrides it), zero3.network (NCCL's transport; gloo ignores it and a warning says so) and
//      zero3.nccl_register_buffers. A backend that cannot serve the device (nccl on cpu, gloo on cuda) is a
//      ConfigError naming zero3.comm_backend, raised before any connection is made.
//   3. resolve(config, InitOptions::resolve) with world_size set to the communicator's size (ResolveInputs::
//      world_size set to anything else is an InvalidArgument). zero3.device is then recorded in the config as
//      chosen ("cpu" or "cuda").
//   4. The Engine, over the resolved config, the communicator and the device. With pipeline.stages above 1 (the
//      config's, or ResolveInputs::pipeline_stages for "auto") Session::engine stays empty: make a
//      zero3::PipelineEngine(s.config, s.comm, *s.device, layers, model) (pipeline_engine.hpp), which makes each
//      stage's engine over its data-parallel group.
// Collective: every rank of the job calls it (it blocks until all have joined, or the timeout). Throws the
// error of the step that failed (ConfigError, InvalidArgument, CommError, TimeoutError, CudaError, Unsupported).
#pragma once

#include <memory>
#include <string>

#include "zero3/comm.hpp"
#include "zero3/config.hpp"
#include "zero3/device.hpp"
#include "zero3/engine.hpp"

namespace zero3 {

struct InitOptions {
  // The program's facts that resolve "auto" (hidden size, micro batch, precision, learning rate, ...).
  // world_size is the communicator's; leave it unset.
  ResolveInputs resolve;
  // "cpu", "cuda", "cuda:N" or "auto"; empty: the config's zero3.device.
  std::string device;
};

// What initialize() made. Members are destroyed in reverse order: the engine first, then the device, then the
// communicator, as the engine needs both. Move-only.
struct Session {
  LaunchInfo launch;                   // the launcher's description of this process
  Config config;                       // the resolved config, the one the engine runs (engine->config())
  std::shared_ptr<Communicator> comm;  // the engine's data-parallel group; see engine.hpp before using it
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;  // empty for a pipelined config (step 4 above)
};

// Loads the DeepSpeed config file (load_config), then initializes from it.
Session initialize(const std::string& config_path, const InitOptions& options = {});

// From a config already in memory (loaded and edited by the program, or built in code).
Session initialize(Config config, const InitOptions& options = {});

}  // namespace zero3

// The table of communicator backends. Each backend registers itself from its own folder with a static
// BackendRegistrar in one of its .cpp files, so a build only knows the backends it compiled:
//
//   namespace { const zero3::comm::BackendRegistrar kReg("gloo", &make_gloo, &gloo_usable); }
//
// make_communicator() looks the name up here and resolves "auto" (see resolve_backend).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero3/comm.hpp"
#include "zero3/store.hpp"

namespace zero3::comm {

using BackendFactory =
    std::function<std::unique_ptr<Communicator>(const CommOptions&, const LaunchInfo&, std::shared_ptr<Store>)>;

// Whether the backend can run in this process for this job (e.g. nccl: a CUDA device is usable). Used
// only by "auto"; an explicitly named backend is always tried and reports its own error.
using BackendUsable = std::function<bool(const CommOptions&, const LaunchInfo&)>;

struct BackendEntry {
  std::string name;
  BackendFactory factory;
  BackendUsable usable;  // empty: always usable
};

// Adds (or replaces) a backend. Thread-safe; normally called during static initialisation.
void register_backend(BackendEntry entry);

// The entry for `name`, or nullptr.
const BackendEntry* find_backend(const std::string& name);

// Registered names, sorted.
std::vector<std::string> registered_backends();

// The backend "auto" resolves to for this job: nccl if registered and usable (a CUDA device), else local when
// the world has one rank (no port to open), else gloo. Throws CommError when none fits (a multi-rank job in a build
// without Gloo or NCCL).
std::string resolve_backend(const CommOptions& options, const LaunchInfo& launch);

struct BackendRegistrar {
  BackendRegistrar(const char* name, BackendFactory factory, BackendUsable usable = {}) {
    register_backend({name, std::move(factory), std::move(usable)});
  }
};

}  // namespace zero3::comm

#include <signal.h>

#include <memory>

#include "comm/bootstrap/launch_agreement.hpp"
#include "comm/registry.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

// Gloo writes to its TCP sockets with plain write(2): once a peer has died, the next write raises SIGPIPE, whose
// default action ends this process at once and silently, before it can report the failure (the CommError that
// names the collective and the peer). Python ignores SIGPIPE, which is why PyTorch's Gloo ranks live to report;
// a C++ program does not. So a program that left SIGPIPE at its default gets it ignored here, and such a write
// fails with EPIPE, which Gloo reports. A program that handles or ignores SIGPIPE itself is left alone.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
    log::debug("SIGPIPE is ignored from now on: a write to a dead peer's socket must fail, not end the process");
  }
}

}  // namespace

std::vector<std::string> available_backends() { return comm::registered_backends(); }

std::unique_ptr<Communicator> make_communicator(const CommOptions& options, const LaunchInfo& launch,
                                                std::shared_ptr<Store> store) {
  if (launch.world_size < 1 || launch.rank < 0 || launch.rank >= launch.world_size) {
    throw CommError("make_communicator: rank " + std::to_string(launch.rank) + " is not in a world of " +
                    std::to_string(launch.world_size) + " (launcher " + launch.launcher + ")");
  }
  if (options.timeout.count() <= 0) {
    throw InvalidArgument("make_communicator: timeout must be positive, got " +
                          std::to_string(options.timeout.count()) + " ms");
  }
  std::string name = options.backend == "auto" ? comm::resolve_backend(options, launch) : options.backend;
  const comm::BackendEntry* entry = comm::find_backend(name);
  if (!entry) {
    std::string names;
    for (const auto& n : available_backends()) names += (names.empty() ? "" : ", ") + n;
    throw CommError("communicator backend \"" + name + "\" is not available in this build (available: " + names +
                    ", or auto)");
  }
  if (name == "gloo") ignore_default_sigpipe();
  // Before any backend's own rendezvous, which would fail on a disagreement without naming it.
  if (launch.world_size > 1 && store) bootstrap::check_launch_agreement(*store, launch, options.timeout);
  auto comm = entry->factory(options, launch, std::move(store));
  log::debug("communicator ", comm->backend(), ": rank ", comm->rank(), " of ", comm->size(), ", timeout ",
             comm->timeout().count(), " ms");
  return comm;
}

}  // namespace zero3

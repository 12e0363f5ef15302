// Signal handlers that a dependency installs behind the program's back, put back to their defaults as the
// library loads.
//
// libinfinipath (PSM for InfiniPath adapters, a dependency of distribution builds of libfabric, which zero3 links
// for its EFA probe) installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM in its library
// constructor, unless IPATH_NO_BACKTRACE is set; each calls exit(1). A rank that a launcher stops with SIGTERM,
// or that crashes, then "exits with status 1" without a word, runs the program's atexit handlers and static
// destructors inside a signal handler while its other threads go on, and leaves no core. Open MPI sets
// IPATH_NO_BACKTRACE before that library loads for the same reason. A library constructor of zero3 runs after
// those of its dependencies, so here the handlers that belong to that library, and only those, go back to
// SIG_DFL.
#include <dlfcn.h>
#include <signal.h>

#include <cstring>
#include <initializer_list>

namespace zero3 {
namespace {

bool installed_by_infinipath(int sig) {
  struct sigaction current {};
  if (::sigaction(sig, nullptr, &current) != 0) return false;
  void* handler = (current.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(current.sa_sigaction)
                                                       : reinterpret_cast<void*>(current.sa_handler);
  if (handler == reinterpret_cast<void*>(SIG_DFL) || handler == reinterpret_cast<void*>(SIG_IGN)) return false;
  Dl_info info{};
  return ::dladdr(handler, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "infinipath") != nullptr;
}

__attribute__((constructor)) void restore_hijacked_signal_handlers() {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT, SIGTERM}) {
    if (installed_by_infinipath(sig)) ::signal(sig, SIG_DFL);
  }
}

}  // namespace
}  // namespace zero3

#include "zero3/version.hpp"

namespace zero3 {

std::string version() { return ZERO3_VERSION_STRING; }

std::string build_summary() {
  auto line = [](const char* name, bool on) { return std::string(name) + (on ? ": compiled in\n" : ": not compiled\n"); };
  return line("cuda", ZERO3_HAVE_CUDA) + line("nccl", ZERO3_HAVE_NCCL) + line("gloo", ZERO3_HAVE_GLOO) +
         line("libfabric", ZERO3_HAVE_LIBFABRIC) + line("io_uring", ZERO3_HAVE_URING) +
         line("libaio", ZERO3_HAVE_LIBAIO);
}

}  // namespace zero3

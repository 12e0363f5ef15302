// The `zero3` command: `zero3 <command> [args]`. Each command lives in its own file (cmd_*.cpp) and
// registers itself in the table below.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "zero3/error.hpp"
#include "zero3/version.hpp"

namespace {

void print_usage(FILE* out) {
  std::fprintf(out, "usage: zero3 <command> [args]\n\ncommands:\n");
  for (const auto& c : zero3::cli::commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n`zero3 <command> --help` for a command's arguments.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("zero3 %s\n", zero3::version().c_str());
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : zero3::cli::commands()) {
    if (std::strcmp(c.name, argv[1]) == 0) {
      try {
        return c.run(args);
      } catch (const zero3::Error& e) {
        std::fprintf(stderr, "zero3 %s: %s\n", c.name, e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "zero3 %s: unexpected error: %s\n", c.name, e.what());
        return 1;
      } catch (...) {
        std::fprintf(stderr, "zero3 %s: failed with an exception that is not a std::exception\n", c.name);
        return 1;
      }
    }
  }
  std::fprintf(stderr, "zero3: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}

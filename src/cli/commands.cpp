#include "cli/commands.hpp"

namespace zero3::cli {

int run_version(const Args& args);

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"version", "print the version and the backends compiled in", run_version},
  };
  return table;
}

}  // namespace zero3::cli

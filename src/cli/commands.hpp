// The table of `zero3` subcommands. Each cmd_<name>.cpp defines one run function declared here.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace zero3::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);  // exit status: 0 ok, 1 failure, 2 usage error
};

const std::vector<Command>& commands();

}  // namespace zero3::cli

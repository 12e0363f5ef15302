#include "cli/commands.hpp"

namespace zero3::cli {

int run_version(const Args& args);
int run_env(const Args& args);
int run_config(const Args& args);
int run_iobench(const Args& args);
int run_plan(const Args& args);
int run_launch(const Args& args);
int run_ckpt(const Args& args);

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"version", "print the version and the backends compiled in", run_version},
      {"env", "report the build, backends, library versions, devices, EFA, CPU features and hints", run_env},
      {"config", "check a DeepSpeed config and print it resolved (config check FILE), or the key reference", run_config},
      {"iobench", "O_DIRECT read/write GB/s of a directory through the NVMe offload engine", run_iobench},
      {"plan", "dry-run memory plan: bytes per rank and node for a model under a DeepSpeed config", run_plan},
      {"launch", "start N ranks of a program on this node (torchrun-style variables, rank-prefixed output)", run_launch},
      {"ckpt", "inspect and verify a checkpoint, or consolidate it into Hugging Face safetensors", run_ckpt},
  };
  return table;
}

}  // namespace zero3::cli

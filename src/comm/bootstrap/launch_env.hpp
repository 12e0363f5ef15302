// Where this process stands in the job, read from the launcher's environment variables. The public entry
// point is zero3::detect_launch() (comm.hpp); this header adds the form that reads from any lookup, and the
// helpers `zero3 launch` shares with it.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "zero3/comm.hpp"

namespace zero3::bootstrap {

// Returns the variable's value, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The process environment (std::getenv), read at call time.
EnvLookup process_env();

// detect_launch() over `env`. Precedence: torchrun-style variables (RANK and WORLD_SIZE: torchrun, `zero3
// launch`, or set by hand), Kubeflow Trainer (PET_NNODES), Open MPI (OMPI_COMM_WORLD_SIZE), Slurm
// (SLURM_PROCID), else a single process. Throws CommError naming the variable for a value that is not a
// number or is out of range.
LaunchInfo detect_launch_from(const EnvLookup& env);

// The first host name of a Slurm host list: "gpu[07-09,12],cpu3" -> "gpu07".
std::string slurm_first_host(const std::string& nodelist);

// The task count of node `node_index` in a Slurm per-node list: "4(x2),3", node 2 -> 3. Throws CommError.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index, const char* variable);

}  // namespace zero3::bootstrap

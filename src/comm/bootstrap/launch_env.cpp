#include "comm/bootstrap/launch_env.hpp"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace bootstrap {
namespace {

constexpr int kDefaultMasterPort = 29500;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

int parse_int(const std::string& text, const char* variable, int min_value) {
  size_t pos = 0;
  long long value = 0;
  bool ok = !text.empty();
  if (ok) {
    try {
      value = std::stoll(text, &pos, 10);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || pos != text.size() || value < min_value || value > std::numeric_limits<int>::max()) {
    throw CommError(std::string(variable) + "='" + text + "' is not an integer >= " + std::to_string(min_value));
  }
  return static_cast<int>(value);
}

struct Reader {
  const EnvLookup& env;

  std::optional<std::string> str(const char* name) const {
    auto v = env(name);
    if (v && v->empty()) return std::nullopt;  // an empty variable counts as unset
    return v;
  }
  bool has(const char* name) const { return str(name).has_value(); }
  std::optional<int> opt_int(const char* name, int min_value = 0) const {
    auto v = str(name);
    if (!v) return std::nullopt;
    return parse_int(*v, name, min_value);
  }
  int require_int(const char* name, const char* launcher, int min_value = 0) const {
    auto v = opt_int(name, min_value);
    if (!v) throw CommError(std::string(launcher) + " launch: " + name + " is not set");
    return *v;
  }
};

void require_rank_in_world(int rank, const char* rank_var, int world, const char* world_var) {
  if (rank >= world) {
    throw CommError(std::string(rank_var) + "=" + std::to_string(rank) + " is not below " + world_var + "=" +
                    std::to_string(world));
  }
}

int port_of(const Reader& r, const char* var) {
  auto p = r.opt_int(var, 1);
  if (p && *p > 65535) throw CommError(std::string(var) + "=" + std::to_string(*p) + " is not a TCP port");
  return p ? *p : kDefaultMasterPort;
}

bool under_torchelastic(const Reader& r) {
  return r.has("TORCHELASTIC_RUN_ID") || r.has("TORCHELASTIC_RESTART_COUNT") || r.has("TORCHELASTIC_MAX_RESTARTS");
}

// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
LaunchInfo from_torchrun_vars(const Reader& r) {
  LaunchInfo info;
  auto launcher = r.str("ZERO3_LAUNCHER");
  info.launcher = launcher == "zero3-launch" ? "zero3-launch" : under_torchelastic(r) ? "torchrun" : "env";
  const char* who = info.launcher.c_str();
  info.world_size = r.require_int("WORLD_SIZE", who, 1);
  info.rank = r.require_int("RANK", who);
  require_rank_in_world(info.rank, "RANK", info.world_size, "WORLD_SIZE");
  // Set by hand, the local variables may be missing: then the job is taken to be one node.
  info.local_world_size = r.opt_int("LOCAL_WORLD_SIZE", 1).value_or(info.world_size);
  info.local_rank = r.opt_int("LOCAL_RANK").value_or(info.rank % info.local_world_size);
  require_rank_in_world(info.local_rank, "LOCAL_RANK", info.local_world_size, "LOCAL_WORLD_SIZE");
  if (info.local_world_size > info.world_size) {
    throw CommError("LOCAL_WORLD_SIZE=" + std::to_string(info.local_world_size) +
                    " exceeds WORLD_SIZE=" + std::to_string(info.world_size));
  }
  info.node_rank = r.opt_int("GROUP_RANK").value_or(info.rank / info.local_world_size);
  info.master_addr = r.str("MASTER_ADDR").value_or("127.0.0.1");
  info.master_port = port_of(r, "MASTER_PORT");
  return info;
}

// Kubeflow Trainer's torch runtime sets PET_* for torchrun. A native binary started directly in the pod is
// one process per node; several per node need `zero3 launch` (which reads PET_*) or torchrun --no-python,
// both of which set RANK and so never reach here.
LaunchInfo from_kubeflow(const Reader& r) {
  LaunchInfo info;
  info.launcher = "kubeflow";
  int nnodes = r.require_int("PET_NNODES", "kubeflow", 1);
  info.node_rank = r.require_int("PET_NODE_RANK", "kubeflow");
  require_rank_in_world(info.node_rank, "PET_NODE_RANK", nnodes, "PET_NNODES");
  int nproc = 1;
  auto nproc_text = r.str("PET_NPROC_PER_NODE");
  if (nproc_text && !nproc_text->empty() && std::isdigit(static_cast<unsigned char>((*nproc_text)[0]))) {
    nproc = parse_int(*nproc_text, "PET_NPROC_PER_NODE", 1);
  }
  // "auto", "cpu" and "gpu" ask torchrun to count devices; started directly we are one process.
  info.local_world_size = nproc;
  auto local_rank = r.opt_int("LOCAL_RANK");
  if (nproc > 1 && !local_rank) {
    throw CommError("kubeflow launch: PET_NPROC_PER_NODE=" + std::to_string(nproc) +
                    " but this process was started directly, once per pod; start it with `zero3 launch -- "
                    "PROGRAM` (reads PET_*) or `torchrun --no-python PROGRAM`, or set the TrainJob's "
                    "spec.trainer.numProcPerNode to 1");
  }
  info.local_rank = local_rank.value_or(0);
  require_rank_in_world(info.local_rank, "LOCAL_RANK", nproc, "PET_NPROC_PER_NODE");
  info.world_size = nnodes * nproc;
  info.rank = info.node_rank * nproc + info.local_rank;
  info.master_addr = r.str("PET_MASTER_ADDR").value_or("127.0.0.1");
  info.master_port = port_of(r, "PET_MASTER_PORT");
  return info;
}

LaunchInfo from_openmpi(const Reader& r) {
  LaunchInfo info;
  info.launcher = "openmpi";
  info.world_size = r.require_int("OMPI_COMM_WORLD_SIZE", "openmpi", 1);
  info.rank = r.require_int("OMPI_COMM_WORLD_RANK", "openmpi");
  require_rank_in_world(info.rank, "OMPI_COMM_WORLD_RANK", info.world_size, "OMPI_COMM_WORLD_SIZE");
  info.local_world_size = r.opt_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(info.world_size);
  info.local_rank = r.opt_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  require_rank_in_world(info.local_rank, "OMPI_COMM_WORLD_LOCAL_RANK", info.local_world_size,
                        "OMPI_COMM_WORLD_LOCAL_SIZE");
  // Open MPI numbers nodes nowhere in the environment; with its default by-slot mapping node n holds ranks
  // [n*local_size, (n+1)*local_size).
  info.node_rank = info.rank / info.local_world_size;
  if (r.has("MASTER_PORT")) {
    info.master_port = port_of(r, "MASTER_PORT");
  } else if (auto job = r.str("OMPI_MCA_ess_base_jobid") ? r.str("OMPI_MCA_ess_base_jobid") : r.str("PMIX_NAMESPACE")) {
    // Every rank of one mpirun sees the same job id, and concurrent mpiruns on a node get different ports.
    info.master_port = 20000 + static_cast<int>(fnv1a(*job) % 10000);
  }
  int nodes = r.opt_int("OMPI_MCA_orte_num_nodes", 1).value_or(1);
  if (auto addr = r.str("MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (info.local_world_size == info.world_size && nodes == 1) {
    info.master_addr = "127.0.0.1";
  } else {
    throw CommError("openmpi launch over several nodes (OMPI_COMM_WORLD_SIZE=" + std::to_string(info.world_size) +
                    ", OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(info.local_world_size) +
                    "): Open MPI does not say where rank 0 runs; pass it with `mpirun -x MASTER_ADDR=<rank 0 "
                    "host> -x MASTER_PORT=<port>`");
  }
  return info;
}

LaunchInfo from_slurm(const Reader& r) {
  LaunchInfo info;
  info.launcher = "slurm";
  info.world_size = r.require_int("SLURM_NTASKS", "slurm", 1);
  info.rank = r.require_int("SLURM_PROCID", "slurm");
  require_rank_in_world(info.rank, "SLURM_PROCID", info.world_size, "SLURM_NTASKS");
  info.local_rank = r.opt_int("SLURM_LOCALID").value_or(0);
  info.node_rank = r.opt_int("SLURM_NODEID").value_or(0);
  if (auto per_node = r.str("SLURM_STEP_TASKS_PER_NODE")) {
    info.local_world_size = slurm_tasks_on_node(*per_node, info.node_rank, "SLURM_STEP_TASKS_PER_NODE");
  } else if (auto per_node_job = r.str("SLURM_TASKS_PER_NODE")) {
    info.local_world_size = slurm_tasks_on_node(*per_node_job, info.node_rank, "SLURM_TASKS_PER_NODE");
  } else {
    info.local_world_size = r.opt_int("SLURM_NTASKS_PER_NODE", 1).value_or(info.world_size);
  }
  require_rank_in_world(info.local_rank, "SLURM_LOCALID", info.local_world_size, "tasks on this node");
  if (auto addr = r.str("MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (auto nodes = r.str("SLURM_STEP_NODELIST")) {
    info.master_addr = slurm_first_host(*nodes);  // block distribution puts task 0 on the first node
  } else if (auto job_nodes = r.str("SLURM_JOB_NODELIST")) {
    info.master_addr = slurm_first_host(*job_nodes);
  } else {
    info.master_addr = r.str("SLURM_LAUNCH_NODE_IPADDR").value_or("127.0.0.1");
  }
  if (r.has("MASTER_PORT")) {
    info.master_port = port_of(r, "MASTER_PORT");
  } else if (auto job = r.opt_int("SLURM_JOB_ID")) {
    // Jobs sharing a node get different ports without configuration.
    info.master_port = 20000 + *job % 10000;
  } else {
    info.master_port = kDefaultMasterPort;
  }
  return info;
}

void choose_store_port(const Reader& r, LaunchInfo& info) {
  if (auto explicit_port = r.opt_int("ZERO3_STORE_PORT", 0); explicit_port && *explicit_port > 0) {
    if (*explicit_port > 65535)
      throw CommError("ZERO3_STORE_PORT=" + std::to_string(*explicit_port) + " is not a TCP port");
    info.store_port = *explicit_port;
    info.store_port_origin = "ZERO3_STORE_PORT";
    return;
  }
  if (info.launcher == "torchrun") {
    // torchrun's agent serves its own store on MASTER_PORT; ours sits beside it.
    int offset = r.opt_int("ZERO3_STORE_PORT_OFFSET", 1).value_or(1);
    info.store_port = info.master_port + offset;
    if (info.store_port > 65535) {
      throw CommError("MASTER_PORT=" + std::to_string(info.master_port) + " + ZERO3_STORE_PORT_OFFSET=" +
                      std::to_string(offset) + " is not a TCP port; set ZERO3_STORE_PORT");
    }
    info.store_port_origin = "MASTER_PORT+" + std::to_string(offset) + ", since torchrun's own store holds MASTER_PORT";
    return;
  }
  info.store_port = info.master_port;
  info.store_port_origin = info.launcher == "kubeflow" ? "PET_MASTER_PORT" : "MASTER_PORT";
  if (info.launcher == "slurm" && !r.has("MASTER_PORT")) info.store_port_origin = "derived from SLURM_JOB_ID";
  if (info.launcher == "openmpi" && !r.has("MASTER_PORT")) {
    info.store_port_origin = info.master_port == kDefaultMasterPort ? "default" : "derived from the Open MPI job id";
  }
  if (info.launcher == "single") info.store_port_origin = "default";
}

}  // namespace

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

LaunchInfo detect_launch_from(const EnvLookup& env) {
  Reader r{env};
  LaunchInfo info;
  if (r.has("RANK") || r.has("WORLD_SIZE")) {
    info = from_torchrun_vars(r);
  } else if (r.has("PET_NNODES")) {
    info = from_kubeflow(r);
  } else if (r.has("OMPI_COMM_WORLD_SIZE")) {
    info = from_openmpi(r);
  } else if (r.has("SLURM_PROCID")) {
    info = from_slurm(r);
  } else {
    info.master_addr = r.str("MASTER_ADDR").value_or("127.0.0.1");
    info.master_port = port_of(r, "MASTER_PORT");
  }
  choose_store_port(r, info);
  return info;
}

std::string slurm_first_host(const std::string& nodelist) {
  // Take characters up to the first top-level comma; inside brackets keep only each range's first value.
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] == '[') {
      size_t close = nodelist.find(']', i);
      if (close == std::string::npos) throw CommError("Slurm node list '" + nodelist + "' has an unclosed '['");
      std::string inner = nodelist.substr(i + 1, close - i - 1);
      size_t end = inner.find_first_of(",-");
      host += inner.substr(0, end);
      i = close + 1;
    } else {
      host += nodelist[i++];
    }
  }
  if (host.empty()) throw CommError("Slurm node list '" + nodelist + "' names no host");
  return host;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index, const char* variable) {
  // Entries "N" or "N(xR)", comma separated, one per node in node order.
  int node = 0;
  size_t i = 0;
  auto bad = [&] {
    return CommError(std::string(variable) + "='" + tasks_per_node + "' is not a Slurm task list like '4(x2),3'");
  };
  while (i < tasks_per_node.size()) {
    size_t j = i;
    while (j < tasks_per_node.size() && std::isdigit(static_cast<unsigned char>(tasks_per_node[j]))) ++j;
    if (j == i) throw bad();
    int tasks = parse_int(tasks_per_node.substr(i, j - i), variable, 0);
    int repeat = 1;
    if (j < tasks_per_node.size() && tasks_per_node[j] == '(') {
      size_t close = tasks_per_node.find(')', j);
      if (close == std::string::npos || tasks_per_node.compare(j, 2, "(x") != 0) throw bad();
      repeat = parse_int(tasks_per_node.substr(j + 2, close - j - 2), variable, 1);
      j = close + 1;
    }
    if (node_index < node + repeat) return tasks;
    node += repeat;
    if (j < tasks_per_node.size()) {
      if (tasks_per_node[j] != ',') throw bad();
      ++j;
    }
    i = j;
  }
  throw CommError(std::string(variable) + "='" + tasks_per_node + "' lists " + std::to_string(node) +
                  " nodes, but SLURM_NODEID=" + std::to_string(node_index));
}

}  // namespace bootstrap

LaunchInfo detect_launch() { return bootstrap::detect_launch_from(bootstrap::process_env()); }

}  // namespace zero3

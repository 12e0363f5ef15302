// detect_launch() under each launcher's variables, set in this process the way the launcher sets them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "comm/bootstrap/launch_env.hpp"
#include "zero3/comm.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

const char* const kLauncherVars[] = {"RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "LOCAL_WORLD_SIZE",
                                     "GROUP_RANK",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     "TORCHELASTIC_RUN_ID",
                                     "TORCHELASTIC_RESTART_COUNT",
                                     "TORCHELASTIC_MAX_RESTARTS",
                                     "ZERO3_LAUNCHER",
                                     "ZERO3_STORE_PORT",
                                     "ZERO3_STORE_PORT_OFFSET",
                                     "PET_NNODES",
                                     "PET_NPROC_PER_NODE",
                                     "PET_NODE_RANK",
                                     "PET_MASTER_ADDR",
                                     "PET_MASTER_PORT",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "OMPI_COMM_WORLD_NODE_RANK",
                                     "SLURM_PROCID",
                                     "SLURM_NTASKS",
                                     "SLURM_LOCALID",
                                     "SLURM_NODEID",
                                     "SLURM_NTASKS_PER_NODE",
                                     "SLURM_STEP_TASKS_PER_NODE",
                                     "SLURM_TASKS_PER_NODE",
                                     "SLURM_STEP_NODELIST",
                                     "SLURM_JOB_NODELIST",
                                     "SLURM_LAUNCH_NODE_IPADDR",
                                     "SLURM_JOB_ID",
                                     "OMPI_MCA_ess_base_jobid",
                                     "PMIX_NAMESPACE",
                                     "OMPI_MCA_orte_num_nodes"};

// Clears every launcher variable for the test (the test itself may run under one: ctest under Slurm, or
// `zero3 launch`), sets the given ones, and restores the original environment afterwards.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kLauncherVars) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kLauncherVars) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const CommError& e) {
      return e.what();
    }
    return "";
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(LaunchEnv, SingleProcess) {
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.store_port, 29500);
}

TEST_F(LaunchEnv, Torchrun) {
  // torchrun --nnodes 2 --nproc-per-node 4, second node, third process.
  set({{"RANK", "6"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "2"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"},
       {"MASTER_ADDR", "10.0.0.5"},
       {"MASTER_PORT", "29400"},
       {"TORCHELASTIC_RUN_ID", "job1"},
       {"TORCHELASTIC_RESTART_COUNT", "0"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.5");
  EXPECT_EQ(info.master_port, 29400);
  // torchrun's agent serves its own store on MASTER_PORT: ours moves by the offset.
  EXPECT_EQ(info.store_port, 29401);
  EXPECT_NE(info.store_port_origin.find("torchrun"), std::string::npos) << info.store_port_origin;
}

TEST_F(LaunchEnv, TorchrunPortOffsetAndOverride) {
  set({{"RANK", "0"},
       {"WORLD_SIZE", "2"},
       {"MASTER_PORT", "29400"},
       {"TORCHELASTIC_RUN_ID", "x"},
       {"ZERO3_STORE_PORT_OFFSET", "7"}});
  EXPECT_EQ(detect_launch().store_port, 29407);
  set({{"ZERO3_STORE_PORT", "31000"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.store_port, 31000);
  EXPECT_EQ(info.store_port_origin, "ZERO3_STORE_PORT");
  set({{"MASTER_PORT", "65535"}, {"ZERO3_STORE_PORT", ""}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("ZERO3_STORE_PORT"), std::string::npos);
}

TEST_F(LaunchEnv, TorchrunStyleVariablesByHand) {
  set({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "23456"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "env");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);
  // No local variables: one node.
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.store_port, 23456);  // no torchrun agent holds the port
}

TEST_F(LaunchEnv, Zero3Launch) {
  set({{"RANK", "1"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "40000"},
       {"ZERO3_LAUNCHER", "zero3-launch"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "zero3-launch");
  EXPECT_EQ(info.store_port, 40000);
}

TEST_F(LaunchEnv, TorchrunVariablesAreChecked) {
  set({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("RANK=4"), std::string::npos);
  set({{"RANK", "x1"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("RANK='x1'"), std::string::npos);
  set({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("WORLD_SIZE"), std::string::npos);
  set({{"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("MASTER_PORT=70000"), std::string::npos);
  ::unsetenv("MASTER_PORT");
  ::unsetenv("RANK");
  EXPECT_NE(error_of([] { detect_launch(); }).find("RANK is not set"), std::string::npos);
}

TEST_F(LaunchEnv, KubeflowOneProcessPerPod) {
  // What the Trainer's torch plugin puts in a pod of a TrainJob with numNodes 4, numProcPerNode 1.
  set({{"PET_NNODES", "4"},
       {"PET_NPROC_PER_NODE", "1"},
       {"PET_NODE_RANK", "3"},
       {"PET_MASTER_ADDR", "llama-node-0-0.llama"},
       {"PET_MASTER_PORT", "29500"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "kubeflow");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.node_rank, 3);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.master_addr, "llama-node-0-0.llama");
  EXPECT_EQ(info.store_port, 29500);
}

TEST_F(LaunchEnv, KubeflowSeveralProcessesNeedALauncher) {
  set({{"PET_NNODES", "4"},
       {"PET_NPROC_PER_NODE", "4"},
       {"PET_NODE_RANK", "1"},
       {"PET_MASTER_ADDR", "m"},
       {"PET_MASTER_PORT", "29500"}});
  std::string err = error_of([] { detect_launch(); });
  EXPECT_NE(err.find("zero3 launch"), std::string::npos) << err;
  // With a local rank from whoever started the processes, ranks follow node-major order.
  set({{"LOCAL_RANK", "2"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 16);
  EXPECT_EQ(info.local_world_size, 4);
  // numProcPerNode "auto"/"gpu" is for torchrun to count; started directly we are one per pod.
  ::unsetenv("LOCAL_RANK");
  set({{"PET_NPROC_PER_NODE", "auto"}});
  EXPECT_EQ(detect_launch().world_size, 4);
  set({{"PET_NODE_RANK", "4"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("PET_NODE_RANK=4"), std::string::npos);
}

TEST_F(LaunchEnv, TorchrunInsideKubeflowTakesPrecedence) {
  set({{"PET_NNODES", "2"},
       {"PET_NPROC_PER_NODE", "4"},
       {"PET_NODE_RANK", "1"},
       {"PET_MASTER_ADDR", "m"},
       {"PET_MASTER_PORT", "29500"},
       {"RANK", "5"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"},
       {"MASTER_ADDR", "m"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_RUN_ID", "r"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.store_port, 29501);
}

TEST_F(LaunchEnv, OpenMpiSingleNode) {
  set({{"OMPI_COMM_WORLD_RANK", "2"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.store_port, 29500);
}

TEST_F(LaunchEnv, OpenMpiPortFromTheJobId) {
  // What mpirun -np 2 (Open MPI 4) sets, trimmed.
  set({{"OMPI_COMM_WORLD_RANK", "1"},
       {"OMPI_COMM_WORLD_SIZE", "2"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"OMPI_MCA_ess_base_jobid", "1910243329"},
       {"OMPI_MCA_orte_num_nodes", "1"}});
  LaunchInfo a = detect_launch();
  EXPECT_GE(a.store_port, 20000);
  EXPECT_LT(a.store_port, 30000);
  EXPECT_EQ(a.store_port_origin, "derived from the Open MPI job id");
  set({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_EQ(detect_launch().store_port, a.store_port);  // every rank agrees
  set({{"OMPI_MCA_ess_base_jobid", "1910243330"}});
  EXPECT_NE(detect_launch().store_port, a.store_port);  // another mpirun, another port
  // Open MPI 5 names the job through PMIx.
  ::unsetenv("OMPI_MCA_ess_base_jobid");
  set({{"PMIX_NAMESPACE", "prterun-vm-1234@1"}});
  EXPECT_GE(detect_launch().store_port, 20000);
  // Two nodes with one rank each still need to be told where rank 0 is.
  set({{"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_MCA_orte_num_nodes", "2"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("MASTER_ADDR"), std::string::npos);
}

TEST_F(LaunchEnv, OpenMpiSeveralNodesNeedsMasterAddr) {
  set({{"OMPI_COMM_WORLD_RANK", "5"},
       {"OMPI_COMM_WORLD_SIZE", "8"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  std::string err = error_of([] { detect_launch(); });
  EXPECT_NE(err.find("MASTER_ADDR"), std::string::npos) << err;
  set({{"MASTER_ADDR", "node1"}, {"MASTER_PORT", "31111"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.master_addr, "node1");
  EXPECT_EQ(info.store_port, 31111);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
}

TEST_F(LaunchEnv, Slurm) {
  // srun -N 3 -n 10 with the default block distribution: 4, 3, 3 tasks; task 8 is on the third node.
  set({{"SLURM_PROCID", "8"},
       {"SLURM_NTASKS", "10"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "2"},
       {"SLURM_STEP_TASKS_PER_NODE", "4,3(x2)"},
       {"SLURM_STEP_NODELIST", "gpu[07-09]"},
       {"SLURM_JOB_NODELIST", "gpu[07-09],cpu1"},
       {"SLURM_JOB_ID", "123456"},
       {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 8);
  EXPECT_EQ(info.world_size, 10);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.node_rank, 2);
  EXPECT_EQ(info.master_addr, "gpu07");
  EXPECT_EQ(info.store_port, 20000 + 123456 % 10000);
  set({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "30000"}});
  info = detect_launch();
  EXPECT_EQ(info.master_addr, "head");
  EXPECT_EQ(info.store_port, 30000);
}

TEST_F(LaunchEnv, SlurmFallbacks) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "2"},
       {"SLURM_NTASKS_PER_NODE", "2"},
       {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  LaunchInfo info = detect_launch();
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "10.1.1.1");
  EXPECT_EQ(info.store_port, 29500);
  set({{"SLURM_PROCID", "2"}});
  EXPECT_NE(error_of([] { detect_launch(); }).find("SLURM_PROCID=2"), std::string::npos);
}

TEST(SlurmLists, FirstHost) {
  using bootstrap::slurm_first_host;
  EXPECT_EQ(slurm_first_host("node1"), "node1");
  EXPECT_EQ(slurm_first_host("node1,node2"), "node1");
  EXPECT_EQ(slurm_first_host("gpu[007-010,012],cpu1"), "gpu007");
  EXPECT_EQ(slurm_first_host("gpu[3,5]"), "gpu3");
  EXPECT_EQ(slurm_first_host("rack[2-3]-n[1-4]"), "rack2-n1");
  EXPECT_THROW(slurm_first_host("gpu[1-2"), CommError);
  EXPECT_THROW(slurm_first_host(""), CommError);
}

TEST(SlurmLists, TasksOnNode) {
  using bootstrap::slurm_tasks_on_node;
  EXPECT_EQ(slurm_tasks_on_node("4", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 0, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1, "V"), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2, "V"), 3);
  EXPECT_THROW(slurm_tasks_on_node("4(x2),3", 3, "V"), CommError);
  EXPECT_THROW(slurm_tasks_on_node("4(2)", 0, "V"), CommError);
  EXPECT_THROW(slurm_tasks_on_node("a", 0, "V"), CommError);
}

TEST(DetectLaunchFrom, ReadsOnlyTheLookup) {
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};
  auto info = bootstrap::detect_launch_from([&](const char* n) -> std::optional<std::string> {
    auto it = env.find(n);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 1);
}

}  // namespace
}  // namespace zero3

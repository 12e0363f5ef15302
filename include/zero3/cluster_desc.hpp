// A description of a GPU cluster for the step-time model (step_time_model.hpp): the hardware figures and the few
// efficiency factors that turn them into the rates a training step sees. Read from a JSON file of named fields,
// each one required unless marked optional below; configs/clusters/ holds the ones docs/performance-model.md uses,
// with the source of every figure.
//
//   {
//     "name": "4 x g6e.12xlarge over EFA",
//     "nodes": 4,                      "gpus_per_node": 4,
//     "gpu_bf16_tflops": 362.05,       dense bf16 tensor-core peak of one GPU
//     "gpu_memory_gb_s": 864,          one GPU's memory bandwidth (HBM or GDDR)
//     "pcie_gb_s": 32,                 one GPU's host link, each direction
//     "nic_gbit_s": 100,               one node's network link, each direction
//     "cpu_memory_gb_s": 102.4,        one node's host memory bandwidth
//     "nvme_gb_s": 4,                  one node's NVMe bandwidth
//     "matmul_efficiency": 0.5,        fraction of gpu_bf16_tflops a training step's matmuls reach
//     "pcie_efficiency": 0.8,          fraction of pcie_gb_s a pinned copy reaches
//     "nccl_link_efficiency": 0.8,     fraction of the node link's capacity NCCL's ring reaches (large messages)
//     "collective_efficiency": 0.35,   fraction of that rate ZeRO-3's collectives reach in training
//     "flow_limit_gbit_s": 5,          optional: a cap per network flow (a TCP 5-tuple), with
//     "flows_per_node": 2              the flows that carry one node's ring traffic (required with the cap)
//   }
//
// "//" comments are allowed. An unknown key, a missing required one, a value of the wrong type or out of range
// is a ConfigError naming the file and the field.
#pragma once

#include <string>

namespace zero3 {

struct ClusterDesc {
  std::string name;
  int nodes = 0;
  int gpus_per_node = 0;
  double gpu_bf16_tflops = 0;
  double gpu_memory_gb_s = 0;
  double pcie_gb_s = 0;
  double nic_gbit_s = 0;
  double cpu_memory_gb_s = 0;
  double nvme_gb_s = 0;
  double matmul_efficiency = 0;      // (0, 1]
  double pcie_efficiency = 0;        // (0, 1]
  double nccl_link_efficiency = 0;   // (0, 1]
  double collective_efficiency = 0;  // (0, 1]
  double flow_limit_gbit_s = 0;      // 0: no per-flow cap
  int flows_per_node = 0;            // with a per-flow cap

  int world() const { return nodes * gpus_per_node; }
  // The node link's capacity in Gbit/s: the NIC, or the flows' caps when they are lower.
  double link_capacity_gbit_s() const;
  // What ZeRO-3's collectives move over one node's link, GB/s (10^9 bytes): capacity x nccl_link_efficiency x
  // collective_efficiency / 8.
  double inter_node_gb_s() const;
  // One GPU's effective PCIe rate each way, GB/s: pcie_gb_s x pcie_efficiency.
  double pcie_effective_gb_s() const;
};

// Parses a cluster description; `source` names the file in errors. Throws ConfigError.
ClusterDesc parse_cluster_desc(const std::string& json_text, const std::string& source);
// Reads and parses the file. Throws ConfigError (an unreadable file included).
ClusterDesc load_cluster_desc(const std::string& path);

}  // namespace zero3

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
//     "collective_overhead_ms": 14,    optional: the other reading of what ZeRO-3's collectives lose, a fixed time per
//                                      collective that crosses nodes (at the rate without collective_efficiency);
//                                      the step-time model prints both readings as a range
//     "flow_limit_gbit_s": 5,          optional: a cap per network flow (a TCP 5-tuple), with
//     "flows_per_node": 2,             the flows that carry one node's ring traffic (required with the cap)
//     "gpu_memory_gib": 44.99,         optional: one GPU's memory (nvidia-smi's memory.total), with
//     "gpu_reserved_gib": 2,           optional: of it, what no memory plan counts (CUDA context, libraries, NCCL)
//     "host_memory_gib": 384,          optional: one node's host memory, with
//     "host_reserved_gib": 32          optional: of it, what the training processes cannot have (OS, daemons)
//   }
// The memory figures are optional for the step-time model and required by `zero3 plan --advise`, which checks every
// layout's memory plan against them (require_memory_figures()).
//
// "//" comments are allowed. An unknown key, a missing required one, a value of the wrong type or out of range
// is a ConfigError naming the file and the field.
#pragma once

#include <cstdint>
#include <string>

namespace zero3 {

struct ClusterDesc {
  std::string name;
  std::string source;  // the file it was read from, for errors
  int nodes = 0;
  int gpus_per_node = 0;
  double gpu_bf16_tflops = 0;
  double gpu_memory_gb_s = 0;
  double pcie_gb_s = 0;
  double nic_gbit_s = 0;
  double cpu_memory_gb_s = 0;
  double nvme_gb_s = 0;
  double matmul_efficiency = 0;       // (0, 1]
  double pcie_efficiency = 0;         // (0, 1]
  double nccl_link_efficiency = 0;    // (0, 1]
  double collective_efficiency = 0;   // (0, 1]
  double collective_overhead_ms = 0;  // 0: not given (the step time is then the bandwidth reading alone)
  double flow_limit_gbit_s = 0;       // 0: no per-flow cap
  int flows_per_node = 0;             // with a per-flow cap
  double gpu_memory_gib = 0;          // 0: not given
  double gpu_reserved_gib = 0;
  double host_memory_gib = 0;  // 0: not given
  double host_reserved_gib = 0;

  int world() const { return nodes * gpus_per_node; }
  // The node link's capacity in Gbit/s: the NIC, or the flows' caps when they are lower.
  double link_capacity_gbit_s() const;
  // What ZeRO-3's collectives move over one node's link, GB/s (10^9 bytes): capacity x nccl_link_efficiency x
  // collective_efficiency / 8.
  double inter_node_gb_s() const;
  // One GPU's effective PCIe rate each way, GB/s: pcie_gb_s x pcie_efficiency.
  double pcie_effective_gb_s() const;
  // The node link's rate without ZeRO-3's loss, GB/s: capacity x nccl_link_efficiency / 8 (the fixed-cost reading's).
  double nccl_link_gb_s() const;
  // Bytes a memory plan may use: per GPU (gpu_memory_gib - gpu_reserved_gib) and per node's host memory
  // (host_memory_gib - host_reserved_gib), in bytes (GiB = 2^30). Both need require_memory_figures() first.
  int64_t gpu_plan_bytes() const;
  int64_t host_plan_bytes() const;
};

// Throws ConfigError naming the file and the field when gpu_memory_gib or host_memory_gib is missing; `who` says
// what needs it ("zero3 plan --advise").
void require_memory_figures(const ClusterDesc& cluster, const std::string& who);

// Parses a cluster description; `source` names the file in errors. Throws ConfigError.
ClusterDesc parse_cluster_desc(const std::string& json_text, const std::string& source);
// Reads and parses the file. Throws ConfigError (an unreadable file included).
ClusterDesc load_cluster_desc(const std::string& path);

}  // namespace zero3

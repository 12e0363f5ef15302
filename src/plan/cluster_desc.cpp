#include "zero3/cluster_desc.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <tuple>
#include <vector>

#include "config/suggest.hpp"
#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using nlohmann::json;

enum class Range { positive, fraction, non_negative };  // > 0; (0, 1]; >= 0

struct Field {
  const char* name;
  const char* what;  // the unit or meaning, for errors
  Range range;
  bool integer;
  bool required;
};

constexpr Field kNodes{"nodes", "nodes in the cluster", Range::positive, true, true};
constexpr Field kGpusPerNode{"gpus_per_node", "GPUs per node", Range::positive, true, true};
constexpr Field kTflops{"gpu_bf16_tflops", "TFLOP/s", Range::positive, false, true};
constexpr Field kGpuMemory{"gpu_memory_gb_s", "GB/s", Range::positive, false, true};
constexpr Field kPcie{"pcie_gb_s", "GB/s each direction", Range::positive, false, true};
constexpr Field kNic{"nic_gbit_s", "Gbit/s each direction", Range::positive, false, true};
constexpr Field kCpuMemory{"cpu_memory_gb_s", "GB/s", Range::positive, false, true};
constexpr Field kNvme{"nvme_gb_s", "GB/s", Range::positive, false, true};
constexpr Field kMatmul{"matmul_efficiency", "a fraction", Range::fraction, false, true};
constexpr Field kPcieEff{"pcie_efficiency", "a fraction", Range::fraction, false, true};
constexpr Field kNcclEff{"nccl_link_efficiency", "a fraction", Range::fraction, false, true};
constexpr Field kCollectiveEff{"collective_efficiency", "a fraction", Range::fraction, false, true};
constexpr Field kOverhead{"collective_overhead_ms", "ms per collective that crosses nodes", Range::positive, false,
                          false};
constexpr Field kFlowLimit{"flow_limit_gbit_s", "Gbit/s per flow", Range::positive, false, false};
constexpr Field kFlows{"flows_per_node", "flows", Range::positive, true, false};
constexpr Field kGpuGib{"gpu_memory_gib", "GiB of one GPU's memory", Range::positive, false, false};
constexpr Field kGpuReserved{"gpu_reserved_gib", "GiB of one GPU's memory", Range::non_negative, false, false};
constexpr Field kHostGib{"host_memory_gib", "GiB of one node's host memory", Range::positive, false, false};
constexpr Field kHostReserved{"host_reserved_gib", "GiB of one node's host memory", Range::non_negative, false, false};
constexpr const Field* kFields[] = {&kNodes,   &kGpusPerNode,   &kTflops,   &kGpuMemory,   &kPcie,
                                    &kNic,     &kCpuMemory,     &kNvme,     &kMatmul,      &kPcieEff,
                                    &kNcclEff, &kCollectiveEff, &kOverhead, &kFlowLimit,   &kFlows,
                                    &kGpuGib,  &kGpuReserved,   &kHostGib,  &kHostReserved};

double read_field(const json& j, const Field& f, const std::string& source) {
  const json& v = j.at(f.name);
  ZERO3_REQUIRE(v.is_number(), ConfigError, source, ": ", f.name, ": expected a number (", f.what, "), got ", v.dump());
  const double x = v.get<double>();
  ZERO3_REQUIRE(std::isfinite(x), ConfigError, source, ": ", f.name, ": ", v.dump(), " is not a finite number");
  if (f.integer) {
    ZERO3_REQUIRE(v.is_number_integer() && x >= 1 && x <= 1e6, ConfigError, source, ": ", f.name, ": ", v.dump(),
                  " is not a positive whole number of ", f.what, " (at most 1000000)");
  } else if (f.range == Range::non_negative) {
    ZERO3_REQUIRE(x >= 0, ConfigError, source, ": ", f.name, ": ", v.dump(), " is negative, expected ", f.what,
                  " (0 or more)");
  } else if (f.range == Range::fraction) {
    ZERO3_REQUIRE(x > 0 && x <= 1, ConfigError, source, ": ", f.name, ": ", v.dump(), " is not a fraction in (0, 1]");
  } else {
    ZERO3_REQUIRE(x > 0, ConfigError, source, ": ", f.name, ": ", v.dump(), " is not a positive rate (", f.what, ")");
  }
  return x;
}

}  // namespace

double ClusterDesc::link_capacity_gbit_s() const {
  if (flow_limit_gbit_s <= 0) return nic_gbit_s;
  return std::min(nic_gbit_s, flow_limit_gbit_s * flows_per_node);
}

double ClusterDesc::inter_node_gb_s() const {
  return link_capacity_gbit_s() * nccl_link_efficiency * collective_efficiency / 8.0;
}

double ClusterDesc::pcie_effective_gb_s() const { return pcie_gb_s * pcie_efficiency; }

double ClusterDesc::nccl_link_gb_s() const { return link_capacity_gbit_s() * nccl_link_efficiency / 8.0; }

int64_t ClusterDesc::gpu_plan_bytes() const {
  return static_cast<int64_t>((gpu_memory_gib - gpu_reserved_gib) * static_cast<double>(int64_t{1} << 30));
}

int64_t ClusterDesc::host_plan_bytes() const {
  return static_cast<int64_t>((host_memory_gib - host_reserved_gib) * static_cast<double>(int64_t{1} << 30));
}

void require_memory_figures(const ClusterDesc& cluster, const std::string& who) {
  const std::string file = cluster.source.empty() ? std::string("the cluster description") : cluster.source;
  ZERO3_REQUIRE(cluster.gpu_memory_gib > 0, ConfigError, file, ": gpu_memory_gib: missing (", kGpuGib.what, "); ", who,
                " checks every layout's memory per GPU against it");
  ZERO3_REQUIRE(cluster.host_memory_gib > 0, ConfigError, file, ": host_memory_gib: missing (", kHostGib.what, "); ",
                who, " checks every layout's offloaded bytes per node against it");
}

ClusterDesc parse_cluster_desc(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number no double holds
    throw ConfigError(source + ": not valid JSON: " + e.what());
  }
  ZERO3_REQUIRE(j.is_object(), ConfigError, source, ": expected a JSON object of named cluster figures");
  std::vector<std::string_view> names = {"name"};
  for (const Field* f : kFields) names.push_back(f->name);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(names.begin(), names.end(), it.key()) != names.end()) continue;
    std::string close = config_detail::closest_name(it.key(), names);
    throw ConfigError(source + ": unknown field \"" + it.key() + "\"" +
                      (close.empty() ? std::string("") : "; did you mean \"" + close + "\"?"));
  }

  ClusterDesc c;
  c.source = source;
  if (j.contains("name")) {
    ZERO3_REQUIRE(j["name"].is_string(), ConfigError, source, ": name: expected a string, got ", j["name"].dump());
    c.name = j["name"].get<std::string>();
  }
  auto get = [&](const Field& f) -> double {
    if (j.contains(f.name)) return read_field(j, f, source);
    ZERO3_REQUIRE(!f.required, ConfigError, source, ": ", f.name, ": missing (", f.what,
                  "); a cluster description needs every figure the step-time model uses");
    return 0;
  };
  c.nodes = static_cast<int>(get(kNodes));
  c.gpus_per_node = static_cast<int>(get(kGpusPerNode));
  ZERO3_REQUIRE(static_cast<int64_t>(c.nodes) * c.gpus_per_node <= 1000000, ConfigError, source, ": gpus_per_node: ",
                c.gpus_per_node, " on ", c.nodes, " nodes make ", static_cast<int64_t>(c.nodes) * c.gpus_per_node,
                " GPUs; the model takes at most 1000000 in all");
  c.gpu_bf16_tflops = get(kTflops);
  c.gpu_memory_gb_s = get(kGpuMemory);
  c.pcie_gb_s = get(kPcie);
  c.nic_gbit_s = get(kNic);
  c.cpu_memory_gb_s = get(kCpuMemory);
  c.nvme_gb_s = get(kNvme);
  c.matmul_efficiency = get(kMatmul);
  c.pcie_efficiency = get(kPcieEff);
  c.nccl_link_efficiency = get(kNcclEff);
  c.collective_efficiency = get(kCollectiveEff);
  c.collective_overhead_ms = get(kOverhead);
  c.flow_limit_gbit_s = get(kFlowLimit);
  c.flows_per_node = static_cast<int>(get(kFlows));
  c.gpu_memory_gib = get(kGpuGib);
  c.gpu_reserved_gib = get(kGpuReserved);
  c.host_memory_gib = get(kHostGib);
  c.host_reserved_gib = get(kHostReserved);
  for (const auto& [total, reserved, t, r] :
       {std::tuple{c.gpu_memory_gib, c.gpu_reserved_gib, &kGpuGib, &kGpuReserved},
        std::tuple{c.host_memory_gib, c.host_reserved_gib, &kHostGib, &kHostReserved}}) {
    ZERO3_REQUIRE(total <= 1e9, ConfigError, source, ": ", t->name, ": ", total, " is more than 1e9 GiB");
    ZERO3_REQUIRE(reserved == 0 || (total > 0 && reserved < total), ConfigError, source, ": ", r->name, ": ", reserved,
                  total > 0 ? log::concat(" is not below ", t->name, " ", total)
                            : log::concat(" without ", t->name, "; give the memory it is a part of"));
  }
  ZERO3_REQUIRE((c.flow_limit_gbit_s > 0) == (c.flows_per_node > 0), ConfigError, source,
                c.flow_limit_gbit_s > 0 ? ": flows_per_node: missing; flow_limit_gbit_s caps each flow, so the model "
                                          "needs the number of flows that carry a node's traffic"
                                        : ": flow_limit_gbit_s: missing; flows_per_node counts flows for a per-flow "
                                          "cap, so the model needs that cap");
  return c;
}

ClusterDesc load_cluster_desc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZERO3_REQUIRE(in.good(), ConfigError, path, ": cannot open the cluster description");
  std::ostringstream text;
  text << in.rdbuf();
  ZERO3_REQUIRE(!in.bad(), ConfigError, path, ": cannot read the cluster description");
  return parse_cluster_desc(text.str(), path);
}

}  // namespace zero3

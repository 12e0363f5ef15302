#include "comm/fabric/efa_decision.hpp"

#include <algorithm>

#include "zero3/error.hpp"

namespace zero3::fabric {

const char* const kSocketFallbackCost =
    "Without EFA, NCCL falls back to TCP sockets, about 2x slower for ZeRO-3 traffic (the same 50-step "
    "Llama-3-8B job on 4 nodes took 2441 s over EFA and 5409 s over TCP)";

namespace {

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string plural(int n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// Everything that stands between this node and NCCL over EFA; empty when nothing does.
std::vector<std::string> efa_missing(const FabricProbe& probe, const NetPluginCheck& plugin) {
  std::vector<std::string> missing;
  if (!probe.compiled) {
    missing.push_back(
        "this zero3 was built without libfabric, so it cannot see EFA devices (install libfabric-dev, or point "
        "CMake at the EFA installer's libfabric, and rebuild)");
  } else {
    if (!probe.error.empty()) missing.push_back("libfabric: " + probe.error);
    if (probe.efa_devices == 0) {
      std::string s = "libfabric " + probe.version_string() +
                      " has no usable efa provider (providers found: " + join_providers(probe.providers) + ")";
      if (!probe.fi_provider_env.empty()) {
        s += "; FI_PROVIDER=" + probe.fi_provider_env + " limits libfabric to the providers it names";
      } else {
        s += "; is an EFA interface attached to this node (vpc.amazonaws.com/efa) and the efa kernel module loaded?";
      }
      missing.push_back(s);
    }
    if (!probe.version_at_least(kMinLibfabricMajor, kMinLibfabricMinor)) {
      missing.push_back("libfabric " + probe.version_string() + " is older than " + std::to_string(kMinLibfabricMajor) +
                        "." + std::to_string(kMinLibfabricMinor) +
                        ", the minimum of the aws-ofi-nccl plugin (use the EFA installer's libfabric, "
                        "/opt/amazon/efa/lib, ahead of the system one in LD_LIBRARY_PATH)");
    }
  }
  if (!plugin.checked) {
    missing.push_back("the aws-ofi-nccl plugin was not checked");
  } else if (plugin.disabled) {
    missing.push_back("NCCL_NET_PLUGIN=none disables NCCL's network plugins, aws-ofi-nccl included");
  } else if (!plugin.loaded) {
    missing.push_back("the aws-ofi-nccl plugin cannot be loaded (" + join(plugin.failures, "; ") +
                      "); put its directory (e.g. /opt/amazon/ofi-nccl/lib) in LD_LIBRARY_PATH or set "
                      "NCCL_NET_PLUGIN to its path");
  }
  return missing;
}

NetworkDecision use_efa(const FabricProbe& probe, const NetPluginCheck& plugin) {
  NetworkDecision d;
  d.transport = Transport::efa;
  d.net_name = plugin.net_name;
  d.set_plugin = plugin.set_env;
  d.message = "NCCL network: EFA through aws-ofi-nccl (plugin '" + plugin.net_name + "' from " + plugin.path +
              ", net interface v" + std::to_string(plugin.interface_version) + "), libfabric " +
              probe.version_string() + ", " + plural(probe.efa_devices, "EFA device") + " (" +
              join(probe.efa_domains, ", ") + "), GPUDirect RDMA " + (probe.efa_hmem ? "yes" : "no") +
              "; NCCL's network pinned to '" + plugin.net_name + "'";
  if (!d.set_plugin.empty()) d.message += "; NCCL_NET_PLUGIN=" + d.set_plugin + " so that NCCL loads it";
  return d;
}

}  // namespace

NetworkMode parse_network_mode(const std::string& value) {
  if (value == "auto") return NetworkMode::automatic;
  if (value == "efa") return NetworkMode::efa;
  if (value == "socket") return NetworkMode::socket;
  throw ConfigError("zero3.network: \"" + value + "\" is not a network; expected \"auto\", \"efa\" or \"socket\"");
}

const char* network_mode_name(NetworkMode mode) {
  switch (mode) {
    case NetworkMode::automatic:
      return "auto";
    case NetworkMode::efa:
      return "efa";
    case NetworkMode::socket:
      return "socket";
  }
  return "?";
}

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::efa:
      return "efa";
    case Transport::socket:
      return "socket";
    case Transport::nccl_default:
      return "nccl-default";
  }
  return "?";
}

bool needs_plugin_check(NetworkMode mode, const FabricProbe& probe) {
  return mode == NetworkMode::efa || (mode == NetworkMode::automatic && probe.efa_devices > 0);
}

NetworkDecision decide_network(NetworkMode mode, const FabricProbe& probe, const NetPluginCheck& plugin) {
  NetworkDecision d;
  switch (mode) {
    case NetworkMode::socket:
      d.transport = Transport::socket;
      d.net_name = "Socket";
      d.message = "NCCL network: TCP sockets (zero3.network = \"socket\")";
      if (probe.efa_devices > 0) {
        d.warn = true;
        d.message += "; " + plural(probe.efa_devices, "EFA device") + " present and unused. " + kSocketFallbackCost;
      }
      return d;

    case NetworkMode::efa: {
      auto missing = efa_missing(probe, plugin);
      if (missing.empty()) return use_efa(probe, plugin);
      d.error = true;
      d.message = "zero3.network is \"efa\" but EFA cannot be used: " + join(missing, "; ") + ". " +
                  kSocketFallbackCost +
                  ". zero3 stops here instead of running that slowly: fix the above, or set zero3.network to "
                  "\"socket\" to run over TCP sockets knowingly";
      return d;
    }

    case NetworkMode::automatic: {
      if (!probe.compiled) {
        d.message =
            "NCCL network: NCCL's own choice; this zero3 was built without libfabric, so it cannot see EFA "
            "devices (install libfabric-dev and rebuild to have EFA checked and pinned)";
        return d;
      }
      if (probe.efa_devices == 0) {
        d.message = "NCCL network: no EFA device (libfabric " + probe.version_string() +
                    ", providers: " + join_providers(probe.providers) +
                    "), so NCCL picks its own transport between nodes: InfiniBand if present, else TCP sockets";
        if (!probe.error.empty()) d.message += " (libfabric: " + probe.error + ")";
        return d;
      }
      auto missing = efa_missing(probe, plugin);
      if (missing.empty()) return use_efa(probe, plugin);
      d.warn = true;
      d.message = "NCCL network: " + plural(probe.efa_devices, "EFA device") +
                  " found but EFA cannot be used: " + join(missing, "; ") +
                  ". NCCL will use TCP sockets between nodes. " + kSocketFallbackCost +
                  ". Set zero3.network to \"efa\" to make this an error";
      return d;
    }
  }
  return d;
}

std::optional<NetworkDecision> common_network(NetworkMode mode, const std::vector<NetworkDecision>& ranks,
                                              const std::vector<std::string>& hosts) {
  if (ranks.empty() || hosts.size() != ranks.size()) {
    throw InvalidArgument("common_network: " + std::to_string(ranks.size()) + " decisions but " +
                          std::to_string(hosts.size()) + " hosts");
  }
  const int n = static_cast<int>(ranks.size());
  bool one_host = std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; });
  auto where = [&](int r) { return "rank " + std::to_string(r) + " (host " + hosts[r] + ")"; };

  std::vector<int> failing;
  for (int r = 0; r < n; ++r) {
    if (ranks[r].error) failing.push_back(r);
  }
  if (!failing.empty()) {
    NetworkDecision d;
    if (one_host) {
      d.warn = true;
      d.message = "NCCL network: zero3.network is \"efa\" but all " + plural(n, "rank") + " run on host " + hosts[0] +
                  ", where NCCL talks over NVLink, PCIe and shared memory and no network, so EFA is not needed "
                  "here; NCCL keeps its own choice. On several nodes this is an error: " +
                  ranks[failing[0]].message;
      return d;
    }
    d.error = true;
    std::vector<std::string> names;
    for (size_t i = 0; i < failing.size() && i < 8; ++i) names.push_back(std::to_string(failing[i]));
    if (failing.size() > 8) names.push_back("...");
    d.message = std::to_string(failing.size()) + " of " + std::to_string(n) + " ranks cannot use EFA (ranks " +
                join(names, ", ") + "); " + where(failing[0]) + ": " + ranks[failing[0]].message;
    return d;
  }

  if (mode == NetworkMode::automatic) {
    int efa = 0, first_other = -1;
    for (int r = 0; r < n; ++r) {
      if (ranks[r].transport == Transport::efa) {
        ++efa;
      } else if (first_other < 0) {
        first_other = r;
      }
    }
    if (efa > 0 && first_other >= 0) {
      NetworkDecision d;
      d.warn = true;
      d.message = "NCCL network: EFA is not used because " + where(first_other) + " cannot use it (" +
                  ranks[first_other].message + "); " + std::to_string(efa) + " of " + std::to_string(n) +
                  " ranks could. NCCL picks its own transport, TCP sockets on an EFA cluster. " + kSocketFallbackCost;
      return d;
    }
  }
  return std::nullopt;
}

NetworkDecision agree_network(NetworkMode mode, const std::vector<NetworkDecision>& ranks,
                              const std::vector<std::string>& hosts, int self) {
  if (self < 0 || self >= static_cast<int>(ranks.size())) {
    throw InvalidArgument("agree_network: self " + std::to_string(self) + " is not one of " +
                          std::to_string(ranks.size()) + " ranks");
  }
  auto common = common_network(mode, ranks, hosts);
  return common ? *common : ranks[self];
}

std::string encode_decision(const NetworkDecision& d) {
  return "zero3-net-1\n" + std::to_string(static_cast<int>(d.transport)) + "\n" + (d.error ? "1" : "0") + "\n" +
         (d.warn ? "1" : "0") + "\n" + d.net_name + "\n" + d.set_plugin + "\n" + d.message;
}

NetworkDecision decode_decision(const std::string& bytes) {
  std::vector<std::string> f;
  size_t start = 0;
  while (f.size() < 6) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) throw CommError("malformed network decision from the store: too few fields");
    f.push_back(bytes.substr(start, end - start));
    start = end + 1;
  }
  if (f[0] != "zero3-net-1" || f[1].size() != 1 || f[1][0] < '0' || f[1][0] > '2' || (f[2] != "0" && f[2] != "1") ||
      (f[3] != "0" && f[3] != "1")) {
    throw CommError("malformed network decision from the store: bad header");
  }
  NetworkDecision d;
  d.transport = static_cast<Transport>(f[1][0] - '0');
  d.error = f[2] == "1";
  d.warn = f[3] == "1";
  d.net_name = f[4];
  d.set_plugin = f[5];
  d.message = bytes.substr(start);
  return d;
}

}  // namespace zero3::fabric

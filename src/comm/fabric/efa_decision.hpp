// Which network NCCL uses between nodes, decided before NCCL starts, from what the fabric probe and the
// plugin check found and what the config asked for (zero3.network, CommOptions::network):
//
//   "efa"    EFA is required: NCCL's network is pinned to the aws-ofi-nccl plugin (ncclConfig_t.netName),
//            and anything missing (libfabric, the efa provider, libfabric >= 1.18, a loadable plugin) is an
//            error that says what is missing, instead of NCCL's silent fallback to TCP sockets.
//   "auto"   EFA when everything is present (then pinned the same way); otherwise NCCL keeps its own choice
//            and the log says why EFA is not used, loudly when EFA devices exist but cannot be used.
//   "socket" NCCL's TCP socket transport (netName "Socket"), whatever is present.
//
// NCCL's protocols and the plugin's own tuning are never touched. Everything here is a pure function of its
// arguments, so every case is unit-tested; src/comm/nccl applies the result.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/fabric/fabric_probe.hpp"
#include "comm/fabric/net_plugin.hpp"

namespace zero3::fabric {

enum class NetworkMode { automatic, efa, socket };

// "auto" | "efa" | "socket"; anything else throws ConfigError naming zero3.network and the value.
NetworkMode parse_network_mode(const std::string& value);
const char* network_mode_name(NetworkMode mode);

enum class Transport {
  efa,           // NCCL pinned to the aws-ofi-nccl plugin
  socket,        // NCCL pinned to its TCP sockets
  nccl_default,  // not pinned: NCCL picks (a plugin at libnccl-net.so, InfiniBand, else TCP sockets)
};
const char* transport_name(Transport t);

struct NetworkDecision {
  Transport transport = Transport::nccl_default;
  std::string net_name;    // ncclConfig_t.netName; empty: leave NCCL's default
  std::string set_plugin;  // set NCCL_NET_PLUGIN to this before NCCL starts; empty: leave it
  bool error = false;      // EFA was required and cannot be used: throw CommError(message)
  bool warn = false;       // worth a warning: EFA exists but is not used, or EFA is required but irrelevant
  std::string message;     // one paragraph for the start-up log (or the error)
};

// The cost of the fallback, as measured on the seed's cluster; part of every "EFA not used" message.
extern const char* const kSocketFallbackCost;

// Whether decide_network needs a plugin check: EFA was asked for, or the probe found EFA devices.
bool needs_plugin_check(NetworkMode mode, const FabricProbe& probe);

// One rank's decision. `plugin.checked` false means no check ran (see needs_plugin_check).
NetworkDecision decide_network(NetworkMode mode, const FabricProbe& probe, const NetPluginCheck& plugin);

// Every rank's decision and host name (gathered through the store) give either one decision for every rank,
// or nothing, when each rank keeps its own (they agree; pinned names may differ between plugin versions):
// one failing rank fails every rank with a message naming it; under "auto", EFA is used only when every
// rank can use it (NCCL needs the same network on both ends); on one host the network carries nothing, so a
// required EFA that is absent there is a warning, not an error. Throws InvalidArgument on mismatched input.
std::optional<NetworkDecision> common_network(NetworkMode mode, const std::vector<NetworkDecision>& ranks,
                                              const std::vector<std::string>& hosts);

// The decision of rank `self`: common_network's, else its own.
NetworkDecision agree_network(NetworkMode mode, const std::vector<NetworkDecision>& ranks,
                              const std::vector<std::string>& hosts, int self);

// Store encoding of a decision (one rank's, for agree_network).
std::string encode_decision(const NetworkDecision& d);
NetworkDecision decode_decision(const std::string& bytes);  // throws CommError on malformed input

}  // namespace zero3::fabric

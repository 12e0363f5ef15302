#include "comm/fabric/network_negotiation.hpp"

#include <unistd.h>

#include <climits>
#include <vector>

#include "zero3/error.hpp"

namespace zero3::fabric {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

constexpr const char* kKeepOwn = "keep-own";

}  // namespace

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown-host";
  return buf;
}

NetworkDecision decide_network_here(NetworkMode mode) {
  FabricProbe probe = probe_fabric();
  NetPluginCheck plugin;
  if (needs_plugin_check(mode, probe)) plugin = check_net_plugin();
  return decide_network(mode, probe, plugin);
}

NetworkDecision negotiate_network(NetworkMode mode, const NetworkDecision& local, const std::string& host, Store* store,
                                  const std::string& prefix, int rank, int size) {
  if (size == 1) return agree_network(mode, {local}, {host}, 0);
  if (!store) throw InvalidArgument("negotiate_network: a store is needed for " + std::to_string(size) + " ranks");
  if (host.find('\n') != std::string::npos) throw InvalidArgument("negotiate_network: host name has a newline");

  store->set(prefix + "/net/" + std::to_string(rank), bytes_of(host + "\n" + encode_decision(local)));
  const std::string verdict_key = prefix + "/net/verdict";
  if (rank == 0) {
    std::vector<NetworkDecision> all;
    std::vector<std::string> hosts;
    for (int r = 0; r < size; ++r) {
      std::string value = string_of(store->get(prefix + "/net/" + std::to_string(r)));
      size_t nl = value.find('\n');
      if (nl == std::string::npos) throw CommError("malformed network decision of rank " + std::to_string(r));
      hosts.push_back(value.substr(0, nl));
      all.push_back(decode_decision(value.substr(nl + 1)));
    }
    auto common = common_network(mode, all, hosts);
    store->set(verdict_key, bytes_of(common ? encode_decision(*common) : kKeepOwn));
    return common ? *common : local;
  }
  std::string verdict = string_of(store->get(verdict_key));
  if (verdict == kKeepOwn) return local;
  return decode_decision(verdict);
}

}  // namespace zero3::fabric

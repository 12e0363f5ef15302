// The ranks of a job agree on NCCL's network before NCCL starts: each rank publishes its own decision and
// host name under `prefix` in the store, rank 0 reads them all and publishes the verdict (common_network,
// or "each rank keeps its own"), every rank reads the verdict. O(world size) store operations in all.
//
// Collective: every rank calls it with the same prefix. Blocks up to the store's timeout per key (a rank that
// never arrives gives TimeoutError naming the key).
#pragma once

#include <string>

#include "comm/fabric/efa_decision.hpp"
#include "zero3/store.hpp"

namespace zero3::fabric {

// This rank's decision from this machine's probe and plugin check (the plugin is loaded only when needed).
NetworkDecision decide_network_here(NetworkMode mode);

// The agreed decision of `rank`; `store` may be null only when size == 1.
NetworkDecision negotiate_network(NetworkMode mode, const NetworkDecision& local, const std::string& host, Store* store,
                                  const std::string& prefix, int rank, int size);

// gethostname(), or "unknown-host".
std::string host_name();

}  // namespace zero3::fabric

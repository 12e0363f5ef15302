// Do the ranks agree on the world they were launched into? Checked through the store before any backend
// connects, because a rank started with another world size (or a rank number that two processes claim) fails
// deep inside the backends' own rendezvous otherwise: Gloo with "enforce fail at address.cc ... 136 vs 272",
// which names neither the variable nor the ranks; NCCL by waiting.
#pragma once

#include <chrono>

#include "zero3/comm.hpp"
#include "zero3/store.hpp"

namespace zero3::bootstrap {

// Collective over the job's processes. Each publishes its world size, rank, launcher, host and pid under a key
// of its rank; rank 0 compares every rank's world size with its own as the entries arrive and publishes a
// verdict, which the others wait for. Throws CommError naming the launcher's variables (WORLD_SIZE and RANK, or
// the launcher's own), the values and the processes: on every rank for a world size that differs, on the
// second process that claims a rank (and on every rank still waiting for the verdict). TimeoutError, naming the
// ranks that did not publish, when not every rank arrives within `timeout`. Each call uses keys of its own (a
// process-wide count: every rank joins its communicators in the same order).
void check_launch_agreement(Store& store, const LaunchInfo& launch, std::chrono::milliseconds timeout);

}  // namespace zero3::bootstrap

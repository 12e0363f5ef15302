#include "comm/bootstrap/launch_agreement.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <thread>
#include <vector>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::bootstrap {
namespace {

struct Entry {
  int world_size = 0;
  int rank = 0;
  std::string launcher, host;
  long pid = 0;
};

std::string encode(const Entry& e) {
  return std::to_string(e.world_size) + " " + std::to_string(e.rank) + " " + std::to_string(e.pid) + " " + e.launcher +
         " " + e.host;
}

Entry decode(const std::vector<uint8_t>& bytes) {
  Entry e;
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  in >> e.world_size >> e.rank >> e.pid >> e.launcher >> e.host;
  return e;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// The variables the launcher set the rank and the world size with.
const char* rank_variable(const std::string& launcher) {
  if (launcher == "openmpi") return "OMPI_COMM_WORLD_RANK";
  if (launcher == "slurm") return "SLURM_PROCID";
  if (launcher == "kubeflow") return "PET_NODE_RANK/LOCAL_RANK";
  return "RANK";
}

const char* world_variable(const std::string& launcher) {
  if (launcher == "openmpi") return "OMPI_COMM_WORLD_SIZE";
  if (launcher == "slurm") return "SLURM_NTASKS";
  if (launcher == "kubeflow") return "PET_NNODES x PET_NPROC_PER_NODE";
  return "WORLD_SIZE";
}

std::string process(const Entry& e) {
  return "pid " + std::to_string(e.pid) + " on " + e.host + ", launcher " + e.launcher;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

std::string world_mismatch(const Entry& zero, const Entry& other) {
  return std::string("the ranks were started with different world sizes: rank 0 (") + process(zero) + ") has " +
         world_variable(zero.launcher) + "=" + std::to_string(zero.world_size) + ", rank " +
         std::to_string(other.rank) + " (" + process(other) + ") has " + world_variable(other.launcher) + "=" +
         std::to_string(other.world_size) + ". Start every rank of the job with the same " +
         world_variable(zero.launcher);
}

}  // namespace

void check_launch_agreement(Store& store, const LaunchInfo& launch, std::chrono::milliseconds timeout) {
  static std::atomic<int> generation{0};
  const std::string base = "launch/" + std::to_string(generation.fetch_add(1)) + "/";
  const std::string verdict_key = base + "verdict";
  const Entry mine{launch.world_size, launch.rank, launch.launcher, host_name(), static_cast<long>(::getpid())};
  const std::string rank_key = base + "rank/" + std::to_string(launch.rank);

  if (store.add(base + "claims/" + std::to_string(launch.rank), 1) > 1) {
    const Entry first = decode(store.get(rank_key));
    const std::string message = std::string("two processes were started as rank ") + std::to_string(launch.rank) +
                                " (" + rank_variable(launch.launcher) + "=" + std::to_string(launch.rank) +
                                "): " + process(first) + ", and " + process(mine) +
                                ", which came second and stops the job. Give every process of the job its own " +
                                rank_variable(launch.launcher);
    store.set(verdict_key, bytes_of("error\n" + message));
    throw CommError(message);
  }
  store.set(rank_key, bytes_of(encode(mine)));

  if (launch.rank != 0) {
    try {
      store.wait({verdict_key}, timeout);
    } catch (const TimeoutError& e) {
      throw TimeoutError("rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) +
                         " waited " + std::to_string(timeout.count()) +
                         " ms for rank 0 to confirm that every rank agrees on the world (are all ranks running? " +
                         "does rank 0 have the same " + world_variable(launch.launcher) + "?): " + e.what());
    }
    const std::string verdict = text_of(store.get(verdict_key));
    if (verdict.rfind("error\n", 0) == 0) {
      try {
        store.add(base + "verdict_read", 1);  // rank 0 keeps its store open until the others have read this
      } catch (const CommError&) {
        // Rank 0 counted this and closed the store before its reply arrived: the verdict is what matters.
      }
      throw CommError(verdict.substr(6));
    }
    const int zero_world = std::stoi(verdict.substr(3));
    if (zero_world != launch.world_size) {
      throw CommError(world_mismatch(decode(store.get(base + "rank/0")), mine));
    }
    return;
  }

  // Rank 0: compare each entry as it arrives, so that a difference is reported without waiting for the rest.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> seen(static_cast<size_t>(launch.world_size), false);
  seen[0] = true;
  size_t missing = seen.size() - 1;
  // The store lives in this process: before throwing (which closes it), give the ranks that have published an
  // entry a moment to read the verdict, so that they report it rather than a closed connection.
  auto let_them_read = [&] {
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    // Every rank that has claimed its number reads the verdict (a second claimant of a number reports on its
    // own), whether or not this loop has seen its entry yet.
    int64_t readers = 0;
    for (int r = 1; r < launch.world_size; ++r) readers += store.add(base + "claims/" + std::to_string(r), 0) > 0;
    while (store.add(base + "verdict_read", 0) < readers && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  auto fail = [&](const std::string& message) {
    if (!store.check({verdict_key})) store.set(verdict_key, bytes_of("error\n" + message));
    let_them_read();
    throw CommError(message);
  };
  while (missing > 0) {
    if (store.check({verdict_key})) {
      const std::string verdict = text_of(store.get(verdict_key));
      let_them_read();
      throw CommError(verdict.rfind("error\n", 0) == 0 ? verdict.substr(6) : verdict);
    }
    for (int r = 1; r < launch.world_size; ++r) {
      const std::string key = base + "rank/" + std::to_string(r);
      if (seen[static_cast<size_t>(r)] || !store.check({key})) continue;
      const Entry other = decode(store.get(key));
      seen[static_cast<size_t>(r)] = true;
      --missing;
      if (other.world_size != launch.world_size) fail(world_mismatch(mine, other));
    }
    if (missing == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string absent;
      for (int r = 1; r < launch.world_size; ++r) {
        if (!seen[static_cast<size_t>(r)]) absent += (absent.empty() ? "" : ", ") + std::to_string(r);
      }
      const std::string message = "rank 0 of " + std::to_string(launch.world_size) + " waited " +
                                  std::to_string(timeout.count()) + " ms for the other ranks to join; missing: rank" +
                                  (missing > 1 ? "s " : " ") + absent + " (" + world_variable(launch.launcher) + "=" +
                                  std::to_string(launch.world_size) + ")";
      store.set(verdict_key, bytes_of("error\n" + message));
      let_them_read();
      throw TimeoutError(message);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  store.set(verdict_key, bytes_of("ok " + std::to_string(launch.world_size)));
}

}  // namespace zero3::bootstrap

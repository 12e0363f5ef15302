#include "comm/registry.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

// Function-local statics: registrars in other translation units may run before this file's globals.
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, BackendEntry>& registry() {
  static std::map<std::string, BackendEntry> table;
  return table;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void register_backend(BackendEntry entry) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::string name = entry.name;
  registry()[name] = std::move(entry);
}

const BackendEntry* find_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name);
  // Entries are never removed, and std::map nodes are stable, so the pointer outlives the lock.
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_backends() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, entry] : registry()) names.push_back(name);
  return names;
}

std::string resolve_backend(const CommOptions& options, const LaunchInfo& launch) {
  const BackendEntry* nccl = find_backend("nccl");
  if (nccl && (!nccl->usable || nccl->usable(options, launch))) return "nccl";
  // A single host process needs no transport: "local" avoids opening a port nobody will connect to.
  if (launch.world_size == 1 && find_backend("local")) return "local";
  if (find_backend("gloo")) return "gloo";
  throw CommError(
      "backend \"auto\": no communicator backend can serve a world of " + std::to_string(launch.world_size) +
      " ranks in this build (available: " + joined(registered_backends()) + "); build with Gloo (libgloo-dev) or NCCL");
}

}  // namespace zero3::comm

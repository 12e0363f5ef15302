#include "comm/fabric/net_plugin.hpp"

#include <dlfcn.h>
#include <link.h>
#include <strings.h>

#include <cstdlib>
#include <cstring>

namespace zero3::fabric {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool iequals(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

// Newest first, as NCCL looks for them.
constexpr int kNewestInterface = 12;
constexpr int kOldestInterface = 2;

}  // namespace

std::vector<PluginCandidate> nccl_net_plugin_candidates(const char* env, bool* disabled) {
  std::vector<PluginCandidate> out;
  *disabled = false;
  if (!env) {
    out.push_back({"libnccl-net.so", true});
    // aws-ofi-nccl's own file names, which NCCL finds only through NCCL_NET_PLUGIN=ofi / aws-ofi.
    out.push_back({"libnccl-net-ofi.so", false});
    out.push_back({"libnccl-net-aws-ofi.so", false});
    return out;
  }
  if (strcasecmp(env, "none") == 0) {
    *disabled = true;
    return out;
  }
  std::string list = env;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    out.push_back({name, true});
    bool is_path = name.find('/') != std::string::npos;
    bool is_lib_file = name.rfind("lib", 0) == 0 && ends_with(name, ".so");
    if (!is_path && !is_lib_file) out.push_back({"libnccl-net-" + name + ".so", true});
  }
  return out;
}

bool is_aws_ofi_name(const std::string& net_name) {
  return iequals(net_name, "Libfabric") || iequals(net_name, "AWS Libfabric") || iequals(net_name, "OFI");
}

NetPluginCheck check_net_plugin(const char* env) {
  NetPluginCheck check;
  check.checked = true;
  auto candidates = nccl_net_plugin_candidates(env, &check.disabled);
  for (const auto& c : candidates) {
    dlerror();
    // RTLD_NOW as NCCL does, so a missing dependency (libfabric.so.1, libcudart) shows up here.
    void* handle = dlopen(c.file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      check.failures.push_back(c.file + ": " + (err ? err : "unknown dlopen error"));
      continue;
    }
    const char* name = nullptr;
    int version = 0;
    for (int v = kNewestInterface; v >= kOldestInterface && !name; --v) {
      std::string symbol = "ncclNetPlugin_v" + std::to_string(v);
      // Every ncclNet_vN_t starts with `const char* name`.
      if (auto* sym = static_cast<const char* const*>(dlsym(handle, symbol.c_str()))) {
        name = *sym;
        version = v;
      }
    }
    if (!name) {
      check.failures.push_back(c.file + ": loads, but exports no ncclNetPlugin_v2..v" +
                               std::to_string(kNewestInterface) + " symbol (not an NCCL network plugin)");
      dlclose(handle);
      continue;
    }
    std::string path = c.file;
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) path = map->l_name;
    if (!is_aws_ofi_name(name)) {
      if (check.other.empty()) check.other = "'" + std::string(name) + "' from " + path;
      check.failures.push_back(c.file + ": the NCCL network plugin '" + name + "', not aws-ofi-nccl");
      dlclose(handle);
      continue;
    }
    check.loaded = true;
    check.file = c.file;
    check.path = path;
    check.net_name = name;
    check.interface_version = version;
    if (!c.nccl_tries) check.set_env = c.file;
    // The handle stays open: NCCL opens the same library next, and closing would rerun its constructors.
    return check;
  }
  return check;
}

NetPluginCheck check_net_plugin() { return check_net_plugin(std::getenv("NCCL_NET_PLUGIN")); }

}  // namespace zero3::fabric

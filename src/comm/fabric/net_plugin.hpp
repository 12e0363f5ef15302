// Can NCCL load a network plugin (aws-ofi-nccl for EFA), and under which name does it register?
//
// NCCL (2.19 and later, 2.28 included) looks for its network plugin like this: with NCCL_NET_PLUGIN unset it
// dlopens "libnccl-net.so"; with NCCL_NET_PLUGIN set, for each comma-separated entry it dlopens the entry as
// given and, when the entry is neither a path nor a "lib*.so" file name, also "libnccl-net-<entry>.so";
// "none" disables plugins. aws-ofi-nccl installs itself as libnccl-net-ofi.so (older images:
// libnccl-net-aws-ofi.so, or a libnccl-net.so symlink). So with NCCL_NET_PLUGIN unset and only
// libnccl-net-ofi.so present NCCL quietly skips the plugin; check_net_plugin() also tries those names and
// says which NCCL_NET_PLUGIN value makes NCCL load what it found.
//
// A plugin registers a name in its ncclNetPlugin_vN symbol (a struct whose first member is the name):
// aws-ofi-nccl 1.12 and later say "Libfabric", older ones "AWS Libfabric" (newer ones too when NCCL_NET is
// "AWS Libfabric"). That name is what ncclConfig_t.netName must match.
#pragma once

#include <string>
#include <vector>

namespace zero3::fabric {

struct PluginCandidate {
  std::string file;  // argument to dlopen
  bool nccl_tries;   // NCCL itself would try this name with the current NCCL_NET_PLUGIN
};

// The names NCCL tries for `env` (the value of NCCL_NET_PLUGIN, nullptr when unset), followed, when it is
// unset, by the aws-ofi-nccl names NCCL does not try. `disabled` is set for "none".
std::vector<PluginCandidate> nccl_net_plugin_candidates(const char* env, bool* disabled);

// The search for aws-ofi-nccl among the candidates. A library that loads but registers another name (an
// InfiniBand plugin, say) is recorded in `other` and the search goes on.
struct NetPluginCheck {
  bool checked = false;               // a check ran (it is skipped when nothing asks for EFA)
  bool disabled = false;              // NCCL_NET_PLUGIN=none
  bool loaded = false;                // an aws-ofi-nccl plugin loaded and exports ncclNetPlugin_vN
  std::string file;                   // the name that loaded
  std::string path;                   // where the dynamic linker found it
  std::string net_name;               // the name the plugin registers ("Libfabric")
  int interface_version = 0;          // N of the newest ncclNetPlugin_vN it exports
  std::string set_env;                // NCCL_NET_PLUGIN value NCCL needs to load `file`; empty when it already would
  std::vector<std::string> failures;  // "<file>: <dlerror>" for every name that did not load
  std::string other;                  // "'IBext' from /path": a network plugin that is not aws-ofi-nccl
};

// True for the names aws-ofi-nccl registers: Libfabric, AWS Libfabric, OFI (any case).
bool is_aws_ofi_name(const std::string& net_name);

// Tries the candidates for `env` in order and keeps the first aws-ofi-nccl plugin that loads (its handle
// stays open, as NCCL will open it again). `env` is NCCL_NET_PLUGIN; pass nullptr for unset.
NetPluginCheck check_net_plugin(const char* env);

// Same, reading NCCL_NET_PLUGIN from the environment.
NetPluginCheck check_net_plugin();

}  // namespace zero3::fabric

// What libfabric offers on this machine: its version, the providers that have usable endpoints, and the EFA
// devices (provider "efa", reliable datagram endpoints, the kind aws-ofi-nccl uses).
//
// The probe is compiled in every build. With ZERO3_HAVE_LIBFABRIC it asks the libfabric the process loaded
// (src/comm/fabric/libfabric/); without it `compiled` is false and every other field is empty. It never
// throws: a libfabric failure is recorded in `error`. Thread-safe (libfabric's fi_getinfo is).
#pragma once

#include <string>
#include <vector>

namespace zero3::fabric {

// libfabric's minimum for the aws-ofi-nccl plugin.
inline constexpr int kMinLibfabricMajor = 1;
inline constexpr int kMinLibfabricMinor = 18;

struct FabricProbe {
  bool compiled = false;  // zero3 was built with libfabric
  std::string error;      // fi_getinfo failed for a reason other than "nothing matches"

  int major = 0;  // version of the libfabric loaded at run time (fi_version())
  int minor = 0;
  int build_major = 0;  // version of the headers zero3 was compiled against
  int build_minor = 0;

  // Provider names with at least one usable endpoint, each once, in libfabric's order; layered providers
  // are split ("tcp;ofi_rxm" gives "tcp" and "ofi_rxm").
  std::vector<std::string> providers;

  int efa_devices = 0;                   // distinct EFA domains with FI_EP_RDM endpoints
  std::vector<std::string> efa_domains;  // e.g. "rdmap16s27-rdm"
  bool efa_hmem = false;                 // the efa provider can register GPU memory (GPUDirect RDMA, FI_HMEM)

  std::string fi_provider_env;  // FI_PROVIDER as set in the environment (it hides other providers)

  bool has_provider(const std::string& name) const;
  bool version_at_least(int maj, int min) const { return major > maj || (major == maj && minor >= min); }
  std::string version_string() const;  // "1.17"
};

FabricProbe probe_fabric();

// "tcp, ofi_rxm, shm" (or "none").
std::string join_providers(const std::vector<std::string>& providers);

}  // namespace zero3::fabric

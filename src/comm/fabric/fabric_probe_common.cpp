// The parts of the fabric probe that do not need libfabric, and the probe of a build without it.
#include <algorithm>
#include <cstdlib>

#include "comm/fabric/fabric_probe.hpp"
#include "zero3/build_config.hpp"

namespace zero3::fabric {

bool FabricProbe::has_provider(const std::string& name) const {
  return std::find(providers.begin(), providers.end(), name) != providers.end();
}

std::string FabricProbe::version_string() const { return std::to_string(major) + "." + std::to_string(minor); }

std::string join_providers(const std::vector<std::string>& providers) {
  if (providers.empty()) return "none";
  std::string out;
  for (const auto& p : providers) out += (out.empty() ? "" : ", ") + p;
  return out;
}

#if !ZERO3_HAVE_LIBFABRIC
FabricProbe probe_fabric() {
  FabricProbe p;
  if (const char* v = std::getenv("FI_PROVIDER")) p.fi_provider_env = v;
  return p;
}
#endif

}  // namespace zero3::fabric

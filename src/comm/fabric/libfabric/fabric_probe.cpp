// The fabric probe over libfabric: fi_getinfo with no hints lists every provider with a usable endpoint;
// fi_getinfo with provider "efa" and FI_EP_RDM lists the EFA devices the way aws-ofi-nccl looks for them.
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "comm/fabric/fabric_probe.hpp"

namespace zero3::fabric {
namespace {

// Ask for the API of the headers we were built with; a newer runtime libfabric still answers.
constexpr uint32_t kApiVersion = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

std::string fi_error(int rc) { return std::string(fi_strerror(-rc)) + " (" + std::to_string(rc) + ")"; }

// fi_getinfo that frees what it got; nullptr hints list everything. Returns the fi_getinfo code.
template <typename Visit>
int for_each_info(fi_info* hints, Visit visit) {
  fi_info* list = nullptr;
  int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints, &list);
  if (rc == 0) {
    for (fi_info* i = list; i; i = i->next) visit(i);
    fi_freeinfo(list);
  }
  return rc;
}

fi_info* efa_hints(bool hmem) {
  fi_info* hints = fi_allocinfo();
  if (!hints) return nullptr;
  hints->fabric_attr->prov_name = strdup("efa");  // fi_freeinfo frees it
  hints->ep_attr->type = FI_EP_RDM;
  if (hmem) {
    // What aws-ofi-nccl asks for to send from and receive into GPU memory.
    hints->caps = FI_MSG | FI_HMEM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  }
  return hints;
}

}  // namespace

FabricProbe probe_fabric() {
  FabricProbe p;
  p.compiled = true;
  uint32_t v = fi_version();
  p.major = static_cast<int>(FI_MAJOR(v));
  p.minor = static_cast<int>(FI_MINOR(v));
  p.build_major = FI_MAJOR_VERSION;
  p.build_minor = FI_MINOR_VERSION;
  if (const char* env = std::getenv("FI_PROVIDER")) p.fi_provider_env = env;

  std::set<std::string> seen;
  int rc = for_each_info(nullptr, [&](fi_info* info) {
    if (!info->fabric_attr || !info->fabric_attr->prov_name) return;
    std::string names = info->fabric_attr->prov_name;
    size_t start = 0;
    while (start <= names.size()) {
      size_t end = names.find(';', start);
      if (end == std::string::npos) end = names.size();
      std::string one = names.substr(start, end - start);
      if (!one.empty() && seen.insert(one).second) p.providers.push_back(one);
      start = end + 1;
    }
  });
  if (rc != 0 && rc != -FI_ENODATA) p.error = "fi_getinfo (all providers) failed: " + fi_error(rc);

  fi_info* hints = efa_hints(false);
  if (!hints) {
    p.error = "fi_allocinfo failed";
    return p;
  }
  std::set<std::string> domains;
  rc = for_each_info(hints, [&](fi_info* info) {
    if (info->domain_attr && info->domain_attr->name && domains.insert(info->domain_attr->name).second) {
      p.efa_domains.push_back(info->domain_attr->name);
    }
  });
  fi_freeinfo(hints);
  if (rc != 0 && rc != -FI_ENODATA && p.error.empty()) p.error = "fi_getinfo (provider efa) failed: " + fi_error(rc);
  p.efa_devices = static_cast<int>(p.efa_domains.size());

  if (p.efa_devices > 0) {
    fi_info* hmem = efa_hints(true);
    if (hmem) {
      rc = for_each_info(hmem, [&](fi_info*) { p.efa_hmem = true; });
      fi_freeinfo(hmem);
    }
  }
  return p;
}

}  // namespace zero3::fabric

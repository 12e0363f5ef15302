// The libfabric probe on this machine, checked against independent sources: the libfabric.so.1 the dynamic
// linker finds (fi_version through dlsym), the fi_info tool's provider list, and the EFA devices the kernel
// shows in /sys/class/infiniband (a device whose driver is "efa"). On Debian's libfabric 1.17 with no EFA
// this is the "no EFA" path: providers present, efa absent.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "comm/fabric/fabric_probe.hpp"
#include "zero3/build_config.hpp"

using namespace zero3::fabric;
namespace fs = std::filesystem;

namespace {

// EFA devices as the kernel lists them: RDMA devices bound to the efa driver.
int kernel_efa_devices() {
  int n = 0;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    fs::path driver = dev.path() / "device" / "driver";
    std::error_code ec2;
    if (fs::read_symlink(driver, ec2).filename() == "efa") ++n;
  }
  return n;
}

// The providers `fi_info` prints ("provider: tcp;ofi_rxm" lines), split at ';'. Empty if the tool is absent.
std::set<std::string> fi_info_providers(bool* ran) {
  std::set<std::string> out;
  *ran = false;
  FILE* f = popen("fi_info 2>/dev/null", "r");
  if (!f) return out;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    std::string s = line;
    auto pos = s.find("provider:");
    if (pos == std::string::npos) continue;
    *ran = true;
    std::string names = s.substr(pos + 9);
    std::string cur;
    for (char c : names) {
      if (c == ';' || c == '\n' || c == ' ') {
        if (!cur.empty()) out.insert(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.insert(cur);
  }
  pclose(f);
  return out;
}

}  // namespace

TEST(FabricProbe, CompiledExactlyWhenTheBuildHasLibfabric) {
  auto p = probe_fabric();
  EXPECT_EQ(p.compiled, ZERO3_HAVE_LIBFABRIC != 0);
  if (!p.compiled) {
    EXPECT_TRUE(p.providers.empty());
    EXPECT_EQ(p.efa_devices, 0);
    EXPECT_EQ(p.major, 0);
  }
}

TEST(FabricProbe, VersionIsTheLoadedLibfabric) {
  auto p = probe_fabric();
  if (!p.compiled) GTEST_SKIP() << "zero3 built without libfabric";
  void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << "zero3 links libfabric, so libfabric.so.1 must already be loaded";
  auto fi_version_fn = reinterpret_cast<uint32_t (*)()>(dlsym(lib, "fi_version"));
  ASSERT_NE(fi_version_fn, nullptr);
  uint32_t v = fi_version_fn();
  EXPECT_EQ(p.major, static_cast<int>(v >> 16));
  EXPECT_EQ(p.minor, static_cast<int>(v & 0xffff));
  EXPECT_EQ(p.version_string(), std::to_string(v >> 16) + "." + std::to_string(v & 0xffff));
  EXPECT_GE(p.build_major, 1);
  dlclose(lib);
}

TEST(FabricProbe, ProvidersMatchFiInfo) {
  auto p = probe_fabric();
  if (!p.compiled) GTEST_SKIP() << "zero3 built without libfabric";
  EXPECT_TRUE(p.error.empty()) << p.error;
  ASSERT_FALSE(p.providers.empty()) << "libfabric lists at least its tcp/udp/shm providers";
  std::set<std::string> unique(p.providers.begin(), p.providers.end());
  EXPECT_EQ(unique.size(), p.providers.size()) << "each provider once";
  for (const auto& name : p.providers) EXPECT_EQ(name.find(';'), std::string::npos) << name;
  EXPECT_EQ(join_providers(p.providers).find("none"), std::string::npos);

  bool ran = false;
  auto tool = fi_info_providers(&ran);
  if (!ran) GTEST_SKIP() << "fi_info (libfabric-bin) not installed; providers: " << join_providers(p.providers);
  EXPECT_EQ(unique, tool) << "probe: " << join_providers(p.providers);
}

TEST(FabricProbe, EfaDevicesMatchTheKernel) {
  auto p = probe_fabric();
  if (!p.compiled) GTEST_SKIP() << "zero3 built without libfabric";
  int kernel = kernel_efa_devices();
  EXPECT_EQ(p.efa_devices, static_cast<int>(p.efa_domains.size()));
  if (kernel == 0) {
    // The "no EFA" path (this CI machine): no efa provider, no device, no GPUDirect.
    EXPECT_EQ(p.efa_devices, 0);
    EXPECT_FALSE(p.has_provider("efa")) << join_providers(p.providers);
    EXPECT_FALSE(p.efa_hmem);
  } else {
    EXPECT_EQ(p.efa_devices, kernel);
    EXPECT_TRUE(p.has_provider("efa"));
  }
}

TEST(FabricProbe, JoinProviders) {
  EXPECT_EQ(join_providers({}), "none");
  EXPECT_EQ(join_providers({"tcp"}), "tcp");
  EXPECT_EQ(join_providers({"tcp", "shm", "efa"}), "tcp, shm, efa");
}

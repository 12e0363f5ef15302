// The NCCL network plugin check: the names NCCL tries, and real dlopen of real libraries. Positive cases
// build tiny plugin libraries with the system C compiler (a struct whose first member is the name, exported
// as ncclNetPlugin_vN, which is all a plugin's identity is).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "comm/fabric/net_plugin.hpp"

using namespace zero3::fabric;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

class FakePlugins : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v cc >/dev/null 2>&1") != 0) GTEST_SKIP() << "no C compiler (cc) to build plugins";
    dir_ = fs::temp_directory_path() / ("zero3_netplugin_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  // Builds lib<file>.so exporting ncclNetPlugin_v<version> named `name`; returns its path.
  std::string make(const std::string& file, const std::string& name, int version) {
    fs::path src = dir_ / (file + ".c");
    std::ofstream(src) << "struct net { const char* name; void* init; };\n"
                       << "__attribute__((visibility(\"default\"))) const struct net ncclNetPlugin_v" << version
                       << " = {\"" << name << "\", 0};\n";
    fs::path so = dir_ / file;
    std::string cmd = "cc -shared -fPIC -o '" + so.string() + "' '" + src.string() + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return so.string();
  }
  fs::path dir_;
};

}  // namespace

TEST(NetPluginCandidates, UnsetTriesNcclsDefaultThenAwsOfiNames) {
  bool disabled = true;
  auto c = nccl_net_plugin_candidates(nullptr, &disabled);
  EXPECT_FALSE(disabled);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].file, "libnccl-net.so");
  EXPECT_TRUE(c[0].nccl_tries);
  EXPECT_EQ(c[1].file, "libnccl-net-ofi.so");
  EXPECT_FALSE(c[1].nccl_tries);
  EXPECT_EQ(c[2].file, "libnccl-net-aws-ofi.so");
  EXPECT_FALSE(c[2].nccl_tries);
}

TEST(NetPluginCandidates, ShortNameAlsoTriesLibncclNetPrefix) {
  bool disabled = false;
  auto c = nccl_net_plugin_candidates("ofi", &disabled);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].file, "ofi");
  EXPECT_EQ(c[1].file, "libnccl-net-ofi.so");
  EXPECT_TRUE(c[0].nccl_tries && c[1].nccl_tries);
}

TEST(NetPluginCandidates, PathsAndLibraryNamesAreTakenAsGiven) {
  bool disabled = false;
  auto c = nccl_net_plugin_candidates("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", &disabled);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].file, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so");
  c = nccl_net_plugin_candidates("libnccl-net-aws-ofi.so", &disabled);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].file, "libnccl-net-aws-ofi.so");
}

TEST(NetPluginCandidates, CommaListAndNone) {
  bool disabled = false;
  auto c = nccl_net_plugin_candidates("ofi,,/x/libnccl-net.so", &disabled);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].file, "ofi");
  EXPECT_EQ(c[1].file, "libnccl-net-ofi.so");
  EXPECT_EQ(c[2].file, "/x/libnccl-net.so");
  c = nccl_net_plugin_candidates("NONE", &disabled);
  EXPECT_TRUE(disabled);
  EXPECT_TRUE(c.empty());
}

TEST(NetPluginCheck, NoneDisablesPlugins) {
  auto check = check_net_plugin("none");
  EXPECT_TRUE(check.checked);
  EXPECT_TRUE(check.disabled);
  EXPECT_FALSE(check.loaded);
}

TEST(NetPluginCheck, MissingFileSaysWhatDlopenSaid) {
  auto check = check_net_plugin("/nonexistent/zero3/libnccl-net-ofi.so");
  EXPECT_FALSE(check.loaded);
  ASSERT_EQ(check.failures.size(), 1u);
  EXPECT_TRUE(contains(check.failures[0], "/nonexistent/zero3/libnccl-net-ofi.so")) << check.failures[0];
  EXPECT_TRUE(contains(check.failures[0], "No such file or directory")) << check.failures[0];
}

TEST(NetPluginCheck, ALibraryThatIsNoPluginIsRejected) {
  // "libm.so.6" does not end in ".so", so NCCL (and the check) also tries "libnccl-net-libm.so.6.so".
  auto check = check_net_plugin("libm.so.6");
  EXPECT_FALSE(check.loaded);
  ASSERT_EQ(check.failures.size(), 2u);
  EXPECT_TRUE(contains(check.failures[0], "exports no ncclNetPlugin_v2..v12 symbol")) << check.failures[0];
  EXPECT_TRUE(contains(check.failures[1], "libnccl-net-libm.so.6.so")) << check.failures[1];
}

TEST_F(FakePlugins, AwsOfiPluginIsFoundWithItsRegisteredName) {
  std::string path = make("libnccl-net-ofi.so", "Libfabric", 10);
  auto check = check_net_plugin(path.c_str());
  ASSERT_TRUE(check.loaded) << joined(check.failures);
  EXPECT_EQ(check.net_name, "Libfabric");
  EXPECT_EQ(check.interface_version, 10);
  EXPECT_EQ(check.file, path);
  EXPECT_EQ(fs::canonical(check.path), fs::canonical(path));
  EXPECT_TRUE(check.set_env.empty()) << "NCCL itself tries a path given in NCCL_NET_PLUGIN";
}

TEST_F(FakePlugins, OldPluginRegistersAwsLibfabric) {
  std::string path = make("libnccl-net-old.so", "AWS Libfabric", 6);
  auto check = check_net_plugin(path.c_str());
  ASSERT_TRUE(check.loaded) << joined(check.failures);
  EXPECT_EQ(check.net_name, "AWS Libfabric");
  EXPECT_EQ(check.interface_version, 6);
}

TEST_F(FakePlugins, AnotherPluginIsSkippedAndNamed) {
  std::string ib = make("libnccl-net-ib.so", "IBext", 9);
  std::string ofi = make("libnccl-net-ofi2.so", "Libfabric", 11);
  std::string list = ib + "," + ofi;
  auto check = check_net_plugin(list.c_str());
  ASSERT_TRUE(check.loaded) << joined(check.failures);
  EXPECT_EQ(check.file, ofi);
  EXPECT_TRUE(contains(check.other, "'IBext' from ")) << check.other;
  ASSERT_EQ(check.failures.size(), 1u);
  EXPECT_TRUE(contains(check.failures[0], "not aws-ofi-nccl")) << check.failures[0];

  auto only_ib = check_net_plugin(ib.c_str());
  EXPECT_FALSE(only_ib.loaded);
  EXPECT_TRUE(contains(only_ib.other, "IBext"));
}

TEST(NetPluginCheck, AwsOfiNames) {
  EXPECT_TRUE(is_aws_ofi_name("Libfabric"));
  EXPECT_TRUE(is_aws_ofi_name("AWS Libfabric"));
  EXPECT_TRUE(is_aws_ofi_name("ofi"));
  EXPECT_FALSE(is_aws_ofi_name("IBext"));
  EXPECT_FALSE(is_aws_ofi_name("Socket"));
}

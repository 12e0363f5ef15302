// The NCCL network decision for every combination of requested mode, fabric probe and plugin check, and the
// agreement of several ranks. Pure functions: the probe and plugin results are built by hand.
#include <gtest/gtest.h>

#include "comm/fabric/efa_decision.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::fabric;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// This machine's truth: Debian's libfabric 1.17, no efa provider.
FabricProbe debian_probe() {
  FabricProbe p;
  p.compiled = true;
  p.major = 1;
  p.minor = 17;
  p.build_major = 1;
  p.build_minor = 17;
  p.providers = {"tcp", "ofi_rxm", "udp", "ofi_rxd", "shm", "sockets"};
  return p;
}

// An EFA node (p5/g6e with the EFA installer).
FabricProbe efa_probe() {
  FabricProbe p;
  p.compiled = true;
  p.major = 1;
  p.minor = 22;
  p.build_major = 1;
  p.build_minor = 22;
  p.providers = {"efa", "tcp", "ofi_rxm", "shm"};
  p.efa_devices = 2;
  p.efa_domains = {"rdmap16s27-rdm", "rdmap32s27-rdm"};
  p.efa_hmem = true;
  return p;
}

FabricProbe not_compiled_probe() { return FabricProbe{}; }

NetPluginCheck plugin_ok(const std::string& set_env = "") {
  NetPluginCheck c;
  c.checked = true;
  c.loaded = true;
  c.file = set_env.empty() ? "libnccl-net.so" : set_env;
  c.path = "/opt/amazon/ofi-nccl/lib/" + c.file;
  c.net_name = "Libfabric";
  c.interface_version = 10;
  c.set_env = set_env;
  return c;
}

NetPluginCheck plugin_missing() {
  NetPluginCheck c;
  c.checked = true;
  c.failures = {"libnccl-net.so: libnccl-net.so: cannot open shared object file: No such file or directory",
                "libnccl-net-ofi.so: libnccl-net-ofi.so: cannot open shared object file: No such file or directory"};
  return c;
}

NetPluginCheck plugin_disabled() {
  NetPluginCheck c;
  c.checked = true;
  c.disabled = true;
  return c;
}

NetPluginCheck not_checked() { return NetPluginCheck{}; }

}  // namespace

TEST(EfaDecision, ParseMode) {
  EXPECT_EQ(parse_network_mode("auto"), NetworkMode::automatic);
  EXPECT_EQ(parse_network_mode("efa"), NetworkMode::efa);
  EXPECT_EQ(parse_network_mode("socket"), NetworkMode::socket);
  try {
    parse_network_mode("ib");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "zero3.network")) << e.what();
    EXPECT_TRUE(contains(e.what(), "\"ib\"")) << e.what();
  }
  EXPECT_STREQ(network_mode_name(NetworkMode::automatic), "auto");
}

TEST(EfaDecision, PluginCheckOnlyWhenEfaIsAskedForOrPresent) {
  EXPECT_TRUE(needs_plugin_check(NetworkMode::efa, debian_probe()));
  EXPECT_TRUE(needs_plugin_check(NetworkMode::efa, not_compiled_probe()));
  EXPECT_FALSE(needs_plugin_check(NetworkMode::automatic, debian_probe()));
  EXPECT_TRUE(needs_plugin_check(NetworkMode::automatic, efa_probe()));
  EXPECT_FALSE(needs_plugin_check(NetworkMode::socket, efa_probe()));
}

TEST(EfaDecision, SocketIsPinnedWhateverIsPresent) {
  auto d = decide_network(NetworkMode::socket, debian_probe(), not_checked());
  EXPECT_EQ(d.transport, Transport::socket);
  EXPECT_EQ(d.net_name, "Socket");
  EXPECT_FALSE(d.error);
  EXPECT_FALSE(d.warn);
  EXPECT_TRUE(contains(d.message, "TCP sockets")) << d.message;

  d = decide_network(NetworkMode::socket, efa_probe(), not_checked());
  EXPECT_EQ(d.net_name, "Socket");
  EXPECT_TRUE(d.warn);
  EXPECT_TRUE(contains(d.message, "2 EFA devices present and unused")) << d.message;
  EXPECT_TRUE(contains(d.message, "2441 s")) << d.message;
}

TEST(EfaDecision, EfaRequiredAndEverythingPresent) {
  auto d = decide_network(NetworkMode::efa, efa_probe(), plugin_ok());
  EXPECT_FALSE(d.error);
  EXPECT_EQ(d.transport, Transport::efa);
  EXPECT_EQ(d.net_name, "Libfabric");
  EXPECT_EQ(d.set_plugin, "");
  EXPECT_TRUE(contains(d.message, "EFA through aws-ofi-nccl")) << d.message;
  EXPECT_TRUE(contains(d.message, "2 EFA devices (rdmap16s27-rdm, rdmap32s27-rdm)")) << d.message;
  EXPECT_TRUE(contains(d.message, "libfabric 1.22")) << d.message;
  EXPECT_TRUE(contains(d.message, "GPUDirect RDMA yes")) << d.message;
}

TEST(EfaDecision, PluginFoundUnderANameNcclDoesNotTry) {
  auto d = decide_network(NetworkMode::efa, efa_probe(), plugin_ok("libnccl-net-ofi.so"));
  EXPECT_EQ(d.transport, Transport::efa);
  EXPECT_EQ(d.set_plugin, "libnccl-net-ofi.so");
  EXPECT_TRUE(contains(d.message, "NCCL_NET_PLUGIN=libnccl-net-ofi.so")) << d.message;
}

TEST(EfaDecision, OldPluginNameIsPinnedAsRegistered) {
  auto plugin = plugin_ok();
  plugin.net_name = "AWS Libfabric";
  auto d = decide_network(NetworkMode::efa, efa_probe(), plugin);
  EXPECT_EQ(d.net_name, "AWS Libfabric");
}

TEST(EfaDecision, EfaRequiredOnThisMachineFailsNamingWhatIsMissing) {
  // Debian libfabric 1.17 without efa, and no plugin: every missing piece is named.
  auto d = decide_network(NetworkMode::efa, debian_probe(), plugin_missing());
  EXPECT_TRUE(d.error);
  EXPECT_TRUE(d.net_name.empty());
  EXPECT_TRUE(contains(d.message, "zero3.network is \"efa\" but EFA cannot be used")) << d.message;
  EXPECT_TRUE(contains(d.message, "no usable efa provider (providers found: tcp, ofi_rxm, udp, ofi_rxd, shm, sockets)"))
      << d.message;
  EXPECT_TRUE(contains(d.message, "libfabric 1.17 is older than 1.18")) << d.message;
  EXPECT_TRUE(contains(d.message, "aws-ofi-nccl plugin cannot be loaded")) << d.message;
  EXPECT_TRUE(contains(d.message, "libnccl-net-ofi.so: cannot open shared object file")) << d.message;
  EXPECT_TRUE(contains(d.message, "about 2x slower")) << d.message;
  EXPECT_TRUE(contains(d.message, "2441 s over EFA and 5409 s over TCP")) << d.message;
  EXPECT_TRUE(contains(d.message, "\"socket\"")) << d.message;
}

TEST(EfaDecision, EfaRequiredEachMissingPieceAlone) {
  {  // only the plugin is missing
    auto d = decide_network(NetworkMode::efa, efa_probe(), plugin_missing());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "plugin cannot be loaded")) << d.message;
    EXPECT_FALSE(contains(d.message, "older than")) << d.message;
    EXPECT_FALSE(contains(d.message, "no usable efa provider")) << d.message;
  }
  {  // plugins disabled
    auto d = decide_network(NetworkMode::efa, efa_probe(), plugin_disabled());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "NCCL_NET_PLUGIN=none")) << d.message;
  }
  {  // libfabric too old, efa present
    auto probe = efa_probe();
    probe.minor = 17;
    auto d = decide_network(NetworkMode::efa, probe, plugin_ok());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "libfabric 1.17 is older than 1.18")) << d.message;
    EXPECT_FALSE(contains(d.message, "plugin cannot be loaded")) << d.message;
  }
  {  // efa provider hidden by FI_PROVIDER
    auto probe = debian_probe();
    probe.minor = 21;
    probe.fi_provider_env = "tcp";
    auto d = decide_network(NetworkMode::efa, probe, plugin_ok());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "FI_PROVIDER=tcp")) << d.message;
  }
  {  // libfabric not compiled in
    auto d = decide_network(NetworkMode::efa, not_compiled_probe(), plugin_ok());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "built without libfabric")) << d.message;
  }
  {  // a probe failure
    auto probe = efa_probe();
    probe.error = "fi_getinfo (provider efa) failed: Input/output error (-5)";
    auto d = decide_network(NetworkMode::efa, probe, plugin_ok());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "Input/output error")) << d.message;
  }
  {  // plugin not checked is never taken for "present"
    auto d = decide_network(NetworkMode::efa, efa_probe(), not_checked());
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "not checked")) << d.message;
  }
}

TEST(EfaDecision, AutoWithoutEfaLeavesNcclAloneAndSaysWhy) {
  auto d = decide_network(NetworkMode::automatic, debian_probe(), not_checked());
  EXPECT_FALSE(d.error);
  EXPECT_FALSE(d.warn);
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_TRUE(d.net_name.empty());
  EXPECT_TRUE(contains(d.message, "no EFA device (libfabric 1.17")) << d.message;
  EXPECT_TRUE(contains(d.message, "TCP sockets")) << d.message;

  d = decide_network(NetworkMode::automatic, not_compiled_probe(), not_checked());
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_FALSE(d.error);
  EXPECT_TRUE(contains(d.message, "built without libfabric")) << d.message;
}

TEST(EfaDecision, AutoWithEfaUsesIt) {
  auto d = decide_network(NetworkMode::automatic, efa_probe(), plugin_ok());
  EXPECT_EQ(d.transport, Transport::efa);
  EXPECT_EQ(d.net_name, "Libfabric");
  EXPECT_FALSE(d.warn);
}

TEST(EfaDecision, AutoWithEfaDevicesButNoPluginWarnsLoudly) {
  auto d = decide_network(NetworkMode::automatic, efa_probe(), plugin_missing());
  EXPECT_FALSE(d.error);
  EXPECT_TRUE(d.warn);
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_TRUE(d.net_name.empty());
  EXPECT_TRUE(contains(d.message, "2 EFA devices found but EFA cannot be used")) << d.message;
  EXPECT_TRUE(contains(d.message, "TCP sockets")) << d.message;
  EXPECT_TRUE(contains(d.message, "5409 s")) << d.message;
}

TEST(EfaDecision, AgreementAllEfa) {
  auto ok = decide_network(NetworkMode::efa, efa_probe(), plugin_ok());
  auto d = agree_network(NetworkMode::efa, {ok, ok, ok, ok}, {"a", "a", "b", "b"}, 2);
  EXPECT_EQ(d.transport, Transport::efa);
  EXPECT_EQ(d.net_name, "Libfabric");
}

TEST(EfaDecision, AgreementOneFailingRankFailsEveryRankNamingIt) {
  auto ok = decide_network(NetworkMode::efa, efa_probe(), plugin_ok());
  auto bad = decide_network(NetworkMode::efa, efa_probe(), plugin_missing());
  for (int self = 0; self < 4; ++self) {
    auto d = agree_network(NetworkMode::efa, {ok, ok, bad, bad}, {"a", "a", "b", "b"}, self);
    EXPECT_TRUE(d.error);
    EXPECT_TRUE(contains(d.message, "2 of 4 ranks cannot use EFA (ranks 2, 3)")) << d.message;
    EXPECT_TRUE(contains(d.message, "rank 2 (host b)")) << d.message;
    EXPECT_TRUE(contains(d.message, "plugin cannot be loaded")) << d.message;
  }
}

TEST(EfaDecision, AgreementRequiredEfaOnOneHostIsOnlyAWarning) {
  auto bad = decide_network(NetworkMode::efa, debian_probe(), plugin_missing());
  auto d = agree_network(NetworkMode::efa, {bad, bad}, {"box", "box"}, 1);
  EXPECT_FALSE(d.error);
  EXPECT_TRUE(d.warn);
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_TRUE(d.net_name.empty());
  EXPECT_TRUE(contains(d.message, "all 2 ranks run on host box")) << d.message;
  EXPECT_TRUE(contains(d.message, "On several nodes this is an error")) << d.message;
}

TEST(EfaDecision, AgreementAutoNeedsEfaOnEveryRank) {
  auto efa = decide_network(NetworkMode::automatic, efa_probe(), plugin_ok());
  auto none = decide_network(NetworkMode::automatic, debian_probe(), not_checked());
  auto d = agree_network(NetworkMode::automatic, {efa, efa, none}, {"a", "b", "c"}, 0);
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_TRUE(d.net_name.empty());
  EXPECT_TRUE(d.warn);
  EXPECT_TRUE(contains(d.message, "rank 2 (host c) cannot use it")) << d.message;
  EXPECT_TRUE(contains(d.message, "2 of 3 ranks could")) << d.message;

  d = agree_network(NetworkMode::automatic, {none, none}, {"a", "b"}, 1);
  EXPECT_EQ(d.transport, Transport::nccl_default);
  EXPECT_FALSE(d.warn);
}

TEST(EfaDecision, AgreementRejectsMismatchedInput) {
  auto none = decide_network(NetworkMode::automatic, debian_probe(), not_checked());
  EXPECT_THROW(agree_network(NetworkMode::automatic, {none}, {"a", "b"}, 0), InvalidArgument);
  EXPECT_THROW(agree_network(NetworkMode::automatic, {none}, {"a"}, 1), InvalidArgument);
}

TEST(EfaDecision, EncodeDecodeRoundTrip) {
  auto d = decide_network(NetworkMode::efa, efa_probe(), plugin_ok("libnccl-net-ofi.so"));
  d.warn = true;
  auto back = decode_decision(encode_decision(d));
  EXPECT_EQ(back.transport, d.transport);
  EXPECT_EQ(back.net_name, d.net_name);
  EXPECT_EQ(back.set_plugin, d.set_plugin);
  EXPECT_EQ(back.error, d.error);
  EXPECT_EQ(back.warn, d.warn);
  EXPECT_EQ(back.message, d.message);

  EXPECT_THROW(decode_decision(""), CommError);
  EXPECT_THROW(decode_decision("zero3-net-1\n7\n0\n0\n\n\nmsg"), CommError);
  EXPECT_THROW(decode_decision("garbage\n0\n0\n0\n\n\n"), CommError);
  EXPECT_THROW(decode_decision("zero3-net-1\n0\n0\n0\n"), CommError);
}

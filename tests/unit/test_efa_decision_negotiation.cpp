// The ranks agreeing on NCCL's network through a store: one thread per rank, sharing an in-memory Store
// with the blocking get of the real one. Covers the verdicts "each keeps its own", "everyone fails naming
// the failing rank" and "auto falls back together", and the decision this machine makes for itself.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "comm/fabric/network_negotiation.hpp"
#include "zero3/build_config.hpp"
#include "zero3/error.hpp"

using namespace zero3;
using namespace zero3::fabric;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      table_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout(), [&] { return table_.count(key) > 0; })) {
      throw TimeoutError("store get '" + key + "' timed out");
    }
    return table_[key];
  }
  int64_t add(const std::string&, int64_t) override { throw Unsupported("MemoryStore does not support add"); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    for (const auto& k : keys) get(k);
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : keys) {
      if (!table_.count(k)) return false;
    }
    return true;
  }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(2000); }
  size_t keys() {
    std::lock_guard<std::mutex> lock(mu_);
    return table_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> table_;
};

NetworkDecision efa_ok() {
  NetworkDecision d;
  d.transport = Transport::efa;
  d.net_name = "Libfabric";
  d.message = "NCCL network: EFA through aws-ofi-nccl";
  return d;
}

NetworkDecision efa_failed(const std::string& why) {
  NetworkDecision d;
  d.error = true;
  d.message = "zero3.network is \"efa\" but EFA cannot be used: " + why;
  return d;
}

NetworkDecision no_efa() {
  NetworkDecision d;
  d.message = "NCCL network: no EFA device";
  return d;
}

struct Outcome {
  NetworkDecision decision;
  std::string error;
};

// Runs negotiate_network on `locals.size()` threads; rank r lives on hosts[r].
std::vector<Outcome> negotiate_all(NetworkMode mode, const std::vector<NetworkDecision>& locals,
                                   const std::vector<std::string>& hosts, MemoryStore& store) {
  const int n = static_cast<int>(locals.size());
  std::vector<Outcome> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        out[r].decision = negotiate_network(mode, locals[r], hosts[r], &store, "job/0", r, n);
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST(NetworkNegotiation, AgreeingRanksKeepTheirOwnDecision) {
  MemoryStore store;
  auto a = efa_ok(), b = efa_ok();
  b.net_name = "AWS Libfabric";  // an older plugin on one node: the pinned name is local
  auto out = negotiate_all(NetworkMode::efa, {a, a, b, b}, {"n0", "n0", "n1", "n1"}, store);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r].error, "") << "rank " << r;
    EXPECT_EQ(out[r].decision.transport, Transport::efa);
  }
  EXPECT_EQ(out[0].decision.net_name, "Libfabric");
  EXPECT_EQ(out[3].decision.net_name, "AWS Libfabric");
  EXPECT_EQ(store.keys(), 5u) << "one key per rank and the verdict";
}

TEST(NetworkNegotiation, OneRankWithoutEfaFailsEveryRankWithTheSameMessage) {
  MemoryStore store;
  auto out = negotiate_all(NetworkMode::efa, {efa_ok(), efa_ok(), efa_failed("plugin missing"), efa_ok()},
                           {"n0", "n0", "n1", "n1"}, store);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(out[r].decision.error) << "rank " << r;
    EXPECT_TRUE(contains(out[r].decision.message, "1 of 4 ranks cannot use EFA (ranks 2); rank 2 (host n1)"))
        << out[r].decision.message;
    EXPECT_TRUE(contains(out[r].decision.message, "plugin missing")) << out[r].decision.message;
  }
}

TEST(NetworkNegotiation, AutoFallsBackTogether) {
  MemoryStore store;
  auto out = negotiate_all(NetworkMode::automatic, {efa_ok(), no_efa(), efa_ok()}, {"n0", "n1", "n2"}, store);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].decision.transport, Transport::nccl_default) << "rank " << r;
    EXPECT_TRUE(out[r].decision.net_name.empty());
    EXPECT_TRUE(out[r].decision.warn);
    EXPECT_TRUE(contains(out[r].decision.message, "rank 1 (host n1) cannot use it")) << out[r].decision.message;
  }
}

TEST(NetworkNegotiation, MissingRankTimesOutNamingTheKey) {
  MemoryStore store;
  // Rank 0 of 2 alone: it waits for rank 1's decision and gives up after the store's timeout.
  try {
    negotiate_network(NetworkMode::automatic, no_efa(), "n0", &store, "job/1", 0, 2);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "job/1/net/1")) << e.what();
  }
}

TEST(NetworkNegotiation, GarbageInTheStoreIsAnError) {
  MemoryStore store;
  store.set("job/2/net/1", {'x', 'y'});
  EXPECT_THROW(negotiate_network(NetworkMode::automatic, no_efa(), "n0", &store, "job/2", 0, 2), CommError);
}

TEST(NetworkNegotiation, SingleRankNeedsNoStore) {
  auto d = negotiate_network(NetworkMode::socket, decide_network_here(NetworkMode::socket), host_name(), nullptr,
                             "job/3", 0, 1);
  EXPECT_EQ(d.net_name, "Socket");
  EXPECT_THROW(negotiate_network(NetworkMode::automatic, no_efa(), "n0", nullptr, "job/3", 0, 2), InvalidArgument);
}

TEST(NetworkNegotiation, ThisMachineDecidesTruthfully) {
  // No EFA here (CI): auto leaves NCCL alone, efa is an error naming what is missing, socket pins sockets.
  auto probe = probe_fabric();
  if (probe.efa_devices > 0) GTEST_SKIP() << "this machine has EFA devices";
  auto autod = decide_network_here(NetworkMode::automatic);
  EXPECT_EQ(autod.transport, Transport::nccl_default);
  EXPECT_FALSE(autod.error);
  auto efa = decide_network_here(NetworkMode::efa);
  EXPECT_TRUE(efa.error);
  if (ZERO3_HAVE_LIBFABRIC) {
    EXPECT_TRUE(contains(efa.message, "has no usable efa provider")) << efa.message;
  } else {
    EXPECT_TRUE(contains(efa.message, "built without libfabric")) << efa.message;
  }
  auto sock = decide_network_here(NetworkMode::socket);
  EXPECT_EQ(sock.net_name, "Socket");
  EXPECT_FALSE(host_name().empty());
}

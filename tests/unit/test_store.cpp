// The TCP store: the Store contract, concurrency, timeouts, and a server that survives hostile peers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "comm/bootstrap/store_protocol.hpp"
#include "comm/bootstrap/tcp_store.hpp"
#include "zero3/error.hpp"
#include "zero3/store.hpp"

namespace zero3::bootstrap {
namespace {

using namespace std::chrono_literals;
namespace proto = protocol;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

TcpStoreServerOptions fast_options() {
  TcpStoreServerOptions o;
  o.handshake_timeout = 300ms;
  o.frame_timeout = 300ms;
  o.linger = 0ms;
  return o;
}

// A raw TCP connection to the server, for sending what no client would.
class RawPeer {
 public:
  explicit RawPeer(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~RawPeer() { close(); }
  void send(const std::vector<uint8_t>& data) { ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL); }
  void send(const std::string& data) { send(bytes(data)); }
  // Reads the server's greeting, so that closing afterwards sends FIN rather than a reset (closing with
  // unread data resets, and a reset may discard what was sent before it).
  void read_greeting() {
    uint8_t buf[proto::kHandshakeBytes];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = ::recv(fd_, buf + got, sizeof(buf) - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    EXPECT_EQ(got, sizeof(buf));
    EXPECT_TRUE(proto::is_handshake(buf));
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // True once the server closed the connection (reads EOF or an error within `within`).
  bool closed_by_server(std::chrono::milliseconds within) {
    auto deadline = Clock::now() + within;
    char buf[256];
    while (Clock::now() < deadline) {
      timeval tv{0, 50 * 1000};
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

void wait_until(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5s) {
  auto deadline = Clock::now() + limit;
  while (!cond() && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
}

TEST(TcpStore, SetGetAddCheckWait) {
  TcpStore store("127.0.0.1", 0, true, 5s, fast_options());
  EXPECT_GT(store.port(), 0);
  store.set("a", bytes("hello"));
  EXPECT_EQ(text(store.get("a")), "hello");
  store.set("a", bytes("again"));
  EXPECT_EQ(text(store.get("a")), "again");
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty").empty());
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  EXPECT_EQ(text(store.get("n")), "-2");
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "missing"}));
  store.wait({"a", "n"}, 100ms);
  // Binary values survive untouched.
  std::vector<uint8_t> bin(256);
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i);
  store.set("bin", bin);
  EXPECT_EQ(store.get("bin"), bin);
}

TEST(TcpStore, LargestValueAndBounds) {
  TcpStore store("127.0.0.1", 0, true, 5s, fast_options());
  std::vector<uint8_t> big(proto::kMaxValueBytes, 0xab);
  store.set("big", big);
  EXPECT_EQ(store.get("big"), big);
  big.push_back(0);
  EXPECT_THROW(store.set("big", big), InvalidArgument);
  EXPECT_THROW(store.set("", bytes("x")), InvalidArgument);
  EXPECT_THROW(store.set(std::string(proto::kMaxKeyBytes + 1, 'k'), bytes("x")), InvalidArgument);
  // The connection is still good after refusals made on the client side.
  EXPECT_EQ(store.add("ok", 1), 1);
}

TEST(TcpStore, AddOnTextIsAnError) {
  TcpStore store("127.0.0.1", 0, true, 5s, fast_options());
  store.set("word", bytes("abc"));
  EXPECT_THROW(store.add("word", 1), CommError);
  EXPECT_EQ(store.add("fine", 2), 2);
}

TEST(TcpStore, FullStoreRefusesNewKeys) {
  auto options = fast_options();
  options.max_keys = 3;
  TcpStore store("127.0.0.1", 0, true, 5s, options);
  store.set("k1", bytes("1"));
  store.set("k2", bytes("2"));
  store.set("k3", bytes("3"));
  store.set("k3", bytes("overwrite is fine"));
  try {
    store.set("k4", bytes("4"));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, GetWaitsForALaterSet) {
  TcpStore server("127.0.0.1", 0, true, 5s, fast_options());
  TcpStoreClient other("127.0.0.1", server.port(), 5s);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other.set("late", bytes("value"));
  });
  auto t0 = Clock::now();
  EXPECT_EQ(text(server.get("late")), "value");
  EXPECT_GE(Clock::now() - t0, 50ms);
  setter.join();
}

TEST(TcpStore, GetTimesOutNamingTheKeyAndStaysUsable) {
  TcpStore store("127.0.0.1", 0, true, 300ms, fast_options());
  auto t0 = Clock::now();
  try {
    store.get("never");
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
  store.set("after", bytes("x"));
  EXPECT_EQ(text(store.get("after")), "x");
}

TEST(TcpStore, WaitTimesOutNamingMissingKeys) {
  TcpStore store("127.0.0.1", 0, true, 5s, fast_options());
  store.set("here", bytes("1"));
  try {
    store.wait({"here", "gone1", "gone2"}, 200ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gone1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gone2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("here,"), std::string::npos) << msg;
  }
}

TEST(TcpStore, ConcurrentClients) {
  TcpStore server("127.0.0.1", 0, true, 10s, fast_options());
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        TcpStoreClient c("127.0.0.1", server.port(), 10s);
        for (int i = 0; i < kAdds; ++i) c.add("counter", 1);
        c.set("done/" + std::to_string(t), bytes(std::to_string(t)));
        std::vector<std::string> all;
        for (int u = 0; u < kThreads; ++u) all.push_back("done/" + std::to_string(u));
        c.wait(all, 10s);
        for (int u = 0; u < kThreads; ++u) {
          if (text(c.get("done/" + std::to_string(u))) != std::to_string(u)) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(server.add("counter", 0), kThreads * kAdds);
}

TEST(TcpStore, SharedClientAcrossThreads) {
  TcpStore store("127.0.0.1", 0, true, 10s, fast_options());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) store.add("shared", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store.add("shared", 0), 400);
}

TEST(TcpStore, ConnectRetriesUntilTheServerStarts) {
  // Reserve a port, release it, start the server on it later.
  int port;
  {
    TcpStoreServer probe("127.0.0.1", 0, fast_options());
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::string start_error;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    try {
      server = std::make_unique<TcpStoreServer>("127.0.0.1", port, fast_options());
    } catch (const CommError& e) {
      start_error = e.what();  // a parallel test took the port in the meantime
    }
  });
  try {
    TcpStoreClient client("127.0.0.1", port, 3s);
    client.set("x", bytes("1"));
    EXPECT_EQ(text(client.get("x")), "1");
  } catch (const CommError& e) {
    if (start_error.empty()) ADD_FAILURE() << e.what();
  }
  starter.join();
  if (!start_error.empty()) GTEST_SKIP() << "port " << port << " was taken: " << start_error;
}

// A rank at its next connect must not join the store rank 0 still serves for the previous one (it would wait
// there for keys rank 0 writes into its new store): it retries until the store of its own generation answers.
TEST(TcpStore, AClientOfTheNextConnectWaitsForRankZerosNextStore) {
  TcpStoreServerOptions o = fast_options();
  o.generation = 1;
  auto old_server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, o);
  const int port = old_server->port();
  {
    TcpStoreClient first("127.0.0.1", port, 3s, 10s, 1);
    first.set("connect", bytes("1"));
  }
  std::unique_ptr<TcpStoreServer> next_server;
  std::string start_error;
  std::thread rank0([&] {
    std::this_thread::sleep_for(300ms);  // the client below meets the old server first
    old_server.reset();
    try {
      TcpStoreServerOptions n = fast_options();
      n.generation = 2;
      next_server = std::make_unique<TcpStoreServer>("127.0.0.1", port, n);
      TcpStoreClient own("127.0.0.1", port, 3s, 10s, 2);
      own.set("connect", bytes("2"));
    } catch (const CommError& e) {
      start_error = e.what();  // a parallel test took the port in the meantime
    }
  });
  try {
    TcpStoreClient client("127.0.0.1", port, 5s, 10s, 2);
    EXPECT_EQ(text(client.get("connect")), "2");
  } catch (const CommError& e) {
    if (start_error.empty()) ADD_FAILURE() << e.what();
  }
  rank0.join();
  if (!start_error.empty()) GTEST_SKIP() << "port " << port << " was taken: " << start_error;
}

TEST(TcpStore, ConnectGivesUpAtTheTimeout) {
  int port;
  {
    TcpStoreServer probe("127.0.0.1", 0, fast_options());
    port = probe.port();
  }
  auto t0 = Clock::now();
  EXPECT_THROW(TcpStoreClient("127.0.0.1", port, 300ms), TimeoutError);
  EXPECT_LT(Clock::now() - t0, 3s);
}

// Rank 0 that died before it served looks like rank 0 that has not started yet: the wait goes on until the timeout,
// but it says so in the log while it waits.
TEST(TcpStore, AWaitForAStoreThatDoesNotAnswerIsLogged) {
  int port;
  {
    TcpStoreServer probe("127.0.0.1", 0, fast_options());
    port = probe.port();
  }
  testing::internal::CaptureStderr();
  EXPECT_THROW(TcpStoreClient("127.0.0.1", port, 1500ms, 100ms), TimeoutError);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string note = "WARN  the zero3 store at 127.0.0.1:" + std::to_string(port) + " has not answered for ";
  size_t notes = 0;
  for (size_t at = err.find(note); at != std::string::npos; at = err.find(note, at + 1)) ++notes;
  EXPECT_GE(notes, 1u) << err;
  EXPECT_LE(notes, 5u) << "one note, then one every 3 x the first delay: " << err;
  EXPECT_NE(err.find("Is rank 0 running"), std::string::npos) << err;
}

TEST(TcpStore, RefusesAServiceThatIsNotAStore) {
  // A listener that answers every connection with an HTTP line.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread answer([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(c, reply, sizeof(reply) - 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(200ms);
    ::close(c);
  });
  try {
    TcpStoreClient client("127.0.0.1", ntohs(a.sin_port), 2s);
    FAIL() << "expected CommError";
  } catch (const TimeoutError& e) {
    FAIL() << "expected a clear refusal, got a timeout: " << e.what();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("not a zero3 store"), std::string::npos) << e.what();
  }
  answer.join();
  ::close(lfd);
}

TEST(TcpStore, ClientFailsCleanlyWhenTheServerGoes) {
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, 5s, fast_options());
  TcpStoreClient client("127.0.0.1", server->port(), 2s);
  client.set("a", bytes("1"));
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  auto t0 = Clock::now();
  EXPECT_THROW(client.get("never"), CommError);  // parked in a get when the server closes
  EXPECT_LT(Clock::now() - t0, 4s);
  stopper.join();
  EXPECT_THROW(client.set("b", bytes("2")), CommError);  // and every later call says so
}

// Hostile peers: each is dropped with a log line, and an honest client keeps working throughout.
class HostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, fast_options());
    honest_ = std::make_unique<TcpStoreClient>("127.0.0.1", server_->port(), 5s);
    honest_->set("before", bytes("1"));
  }
  void expect_server_fine() {
    EXPECT_EQ(honest_->add("after", 1), ++adds_);
    EXPECT_EQ(text(honest_->get("before")), "1");
  }
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> honest_;
  int adds_ = 0;
};

TEST_F(HostilePeer, GarbageInsteadOfGreeting) {
  RawPeer peer(server_->port());
  peer.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(peer.closed_by_server(2s));
  wait_until([&] { return server_->dropped_peers() >= 1; });
  EXPECT_EQ(server_->dropped_peers(), 1u);
  expect_server_fine();
}

TEST_F(HostilePeer, OversizedFrame) {
  RawPeer peer(server_->port());
  peer.send(proto::handshake());
  std::vector<uint8_t> frame;
  proto::put_u32(frame, 0xffffffffu);
  frame.resize(64, 'x');
  peer.send(frame);
  EXPECT_TRUE(peer.closed_by_server(2s));
  expect_server_fine();
  EXPECT_EQ(server_->dropped_peers(), 1u);
}

TEST_F(HostilePeer, MalformedRequests) {
  std::vector<std::vector<uint8_t>> bad;
  // Unknown op.
  bad.push_back({9, 0, 0, 0, 0x7f, 0, 0, 0, 0, 1, 0, 0, 0});
  // A field length that runs past the frame.
  bad.push_back({13, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0, 0});
  // A get with an empty key.
  bad.push_back({13, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0});
  // A set with one field.
  bad.push_back({14, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'k'});
  for (const auto& frame : bad) {
    RawPeer peer(server_->port());
    peer.send(proto::handshake());
    peer.send(frame);
    EXPECT_TRUE(peer.closed_by_server(2s));
    expect_server_fine();
  }
  wait_until([&] { return server_->dropped_peers() >= bad.size(); });
  EXPECT_EQ(server_->dropped_peers(), bad.size());
}

TEST_F(HostilePeer, RandomBytes) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 50; ++round) {
    RawPeer peer(server_->port());
    if (round % 2) peer.send(proto::handshake());
    std::vector<uint8_t> junk(1 + rng() % 300);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    peer.send(junk);
    peer.close();
  }
  expect_server_fine();
}

TEST_F(HostilePeer, SilentPeerIsDroppedAfterTheGreetingTimeout) {
  RawPeer peer(server_->port());
  wait_until([&] { return server_->connected_clients() == 2; });
  EXPECT_EQ(server_->connected_clients(), 2u);
  expect_server_fine();  // a silent peer blocks nobody
  EXPECT_TRUE(peer.closed_by_server(3s));
  wait_until([&] { return server_->connected_clients() == 1; });
  EXPECT_EQ(server_->connected_clients(), 1u);
  EXPECT_EQ(server_->dropped_peers(), 1u);
}

TEST_F(HostilePeer, StalledFrameIsDropped) {
  RawPeer peer(server_->port());
  peer.send(proto::handshake());
  auto frame = proto::encode_request({proto::Op::set, 0, {"key", "value"}});
  frame.resize(frame.size() / 2);
  peer.send(frame);
  expect_server_fine();
  EXPECT_TRUE(peer.closed_by_server(3s));
  EXPECT_EQ(server_->dropped_peers(), 1u);
  EXPECT_FALSE(honest_->check({"key"}));  // the half frame was never applied
}

TEST_F(HostilePeer, DisconnectMidMessage) {
  {
    RawPeer peer(server_->port());
    peer.send(proto::handshake());
    peer.read_greeting();
    auto frame = proto::encode_request({proto::Op::set, 0, {"key", std::string(1000, 'v')}});
    frame.resize(frame.size() - 10);
    peer.send(frame);
  }
  wait_until([&] { return server_->dropped_peers() >= 1; });
  EXPECT_EQ(server_->dropped_peers(), 1u);
  EXPECT_FALSE(honest_->check({"key"}));
  expect_server_fine();
}

TEST_F(HostilePeer, PeerThatNeverReadsItsReplies) {
  RawPeer peer(server_->port());
  peer.send(proto::handshake());
  honest_->set("big", std::vector<uint8_t>(proto::kMaxValueBytes, 1));
  // Pipeline gets of a 1 MiB value without reading: the server stops buffering at its bound.
  auto get = proto::encode_request({proto::Op::get, 1000, {"big"}});
  for (int i = 0; i < 200; ++i) peer.send(get);
  // The peer reads nothing until the server has dropped it (closed_by_server reads, which a slow server could
  // let keep up with its replies).
  wait_until([&] { return server_->dropped_peers() >= 1; }, 20s);
  EXPECT_EQ(server_->dropped_peers(), 1u);
  EXPECT_TRUE(peer.closed_by_server(10s));
  expect_server_fine();
}

TEST_F(HostilePeer, ParkedGetOfADeadPeerIsForgotten) {
  {
    RawPeer peer(server_->port());
    peer.send(proto::handshake());
    peer.send(proto::encode_request({proto::Op::get, 60000, {"nobody-sets-this"}}));
    std::this_thread::sleep_for(50ms);
  }
  wait_until([&] { return server_->connected_clients() == 1; });
  EXPECT_EQ(server_->connected_clients(), 1u);
  EXPECT_EQ(server_->dropped_peers(), 0u);  // leaving while waiting is not a violation
  expect_server_fine();
}

TEST(StoreProtocol, ParserRejectsEveryTruncation) {
  auto frame = proto::encode_request({proto::Op::wait, 10, {"a", "bb", "ccc"}});
  std::string error;
  ASSERT_TRUE(proto::parse_request(frame.data() + 4, frame.size() - 4, &error)) << error;
  for (size_t n = 0; n < frame.size() - 4; ++n) {
    EXPECT_FALSE(proto::parse_request(frame.data() + 4, n, &error)) << n;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> junk(rng() % 64);
    for (auto& b : junk) b = static_cast<uint8_t>(rng() % 8);  // small bytes: plausible ops and lengths
    auto r = proto::parse_request(junk.data(), junk.size(), &error);
    if (r) {
      auto again = proto::encode_request(*r);
      EXPECT_EQ(std::vector<uint8_t>(again.begin() + 4, again.end()), junk);
    }
  }
}

TEST(PrefixStore, KeysAreIsolated) {
  auto base = std::make_shared<TcpStore>("127.0.0.1", 0, true, 2s, fast_options());
  auto a = make_prefix_store(base, "a");
  auto b = make_prefix_store(base, "b");
  a->set("k", bytes("from a"));
  b->set("k", bytes("from b"));
  EXPECT_EQ(text(a->get("k")), "from a");
  EXPECT_EQ(text(b->get("k")), "from b");
  EXPECT_EQ(text(base->get("a/k")), "from a");
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 3);
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"other"}));
  a->wait({"k"}, 100ms);
  EXPECT_THROW(a->wait({"b/k"}, 50ms), TimeoutError);
  EXPECT_EQ(a->timeout(), base->timeout());
}

TEST(MakeTcpStore, ServesAndConnects) {
  auto server = make_tcp_store("127.0.0.1", 0, true, 2s);
  auto* tcp = dynamic_cast<TcpStore*>(server.get());
  ASSERT_NE(tcp, nullptr);
  auto client = make_tcp_store("127.0.0.1", tcp->port(), false, 2s);
  client->set("x", bytes("y"));
  EXPECT_EQ(text(server->get("x")), "y");
}

}  // namespace
}  // namespace zero3::bootstrap

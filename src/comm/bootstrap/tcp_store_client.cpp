#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "comm/bootstrap/store_protocol.hpp"
#include "comm/bootstrap/tcp_store.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::bootstrap {
namespace proto = protocol;

namespace {

// How long past the server-side wait a reply may take before the server counts as unresponsive.
constexpr auto kReplyGrace = std::chrono::seconds(5);
constexpr size_t kMaxReplyBytes = proto::kMaxValueBytes + 64 * 1024;

std::string key_list(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) s += " and " + std::to_string(keys.size() - 8) + " more";
  return s;
}

}  // namespace

struct TcpStoreClient::Reply {
  proto::Status status;
  std::string payload;
};

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout,
                               std::chrono::milliseconds first_note, uint32_t generation)
    : address_(host + ":" + std::to_string(port)), timeout_(timeout) {
  if (timeout.count() <= 0)
    throw InvalidArgument("store timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  const auto start = Clock::now();
  auto deadline = start + timeout;
  auto next_note = start + first_note;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error;
  while (true) {
    try {
      Fd fd = connect_once(host, port, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
      auto hello = proto::handshake(generation);
      send_all(fd.get(), hello.data(), hello.size(), deadline, address_);
      uint8_t answer[proto::kHandshakeBytes];
      recv_all(fd.get(), answer, sizeof(answer), deadline, address_);
      if (!proto::is_handshake(answer)) {
        throw InvalidArgument("the service at " + address_ +
                              " is not a zero3 store (wrong greeting); if that port belongs to something else "
                              "(torchrun's own store, another job), set ZERO3_STORE_PORT");
      }
      const uint32_t served = proto::handshake_generation(answer);
      if (generation != 0 && served != 0 && served != generation) {
        throw CommError("the store there serves rank 0's connect #" + std::to_string(served) + ", this process is at #" +
                        std::to_string(generation) + " (rank 0 has not opened that one yet)");
      }
      fd_ = std::move(fd);
      return;
    } catch (const InvalidArgument& e) {
      throw CommError(e.what());
    } catch (const CommError& e) {
      // Refused, unresolvable or closed: rank 0 may not be listening yet (it can start last).
      last_error = e.what();
    }
    const auto now = Clock::now();
    if (now + backoff >= deadline) break;
    if (now >= next_note) {
      using std::chrono::duration_cast;
      using std::chrono::seconds;
      log::warn("the zero3 store at ", address_, " has not answered for ", duration_cast<seconds>(now - start).count(),
                " s (", last_error, "); retrying for ", duration_cast<seconds>(deadline - now).count(),
                " s more (the communicator's timeout: zero3.comm_timeout_s, ZERO3_COMM_TIMEOUT_S). Is rank 0 running, "
                "and are MASTER_ADDR and the port right?");
      next_note = now + 3 * first_note;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  throw TimeoutError("cannot reach the zero3 store at " + address_ + " within " + std::to_string(timeout.count()) +
                     " ms (" + last_error + "); is rank 0 running, and are MASTER_ADDR and the port right?");
}

TcpStoreClient::Reply TcpStoreClient::request(int op, std::chrono::milliseconds server_wait,
                                              std::vector<std::string> fields) {
  auto the_op = static_cast<proto::Op>(op);
  std::string what =
      std::string("store ") + proto::op_name(the_op) + " of " +
      (the_op == proto::Op::wait || the_op == proto::Op::check ? "keys " : "key ") +
      key_list(the_op == proto::Op::set || the_op == proto::Op::add ? std::vector<std::string>{fields[0]} : fields) +
      " at " + address_;
  proto::Request req;
  req.op = the_op;
  req.timeout_ms =
      static_cast<uint32_t>(std::clamp<int64_t>(server_wait.count(), 0, std::numeric_limits<uint32_t>::max()));
  req.fields = std::move(fields);
  std::vector<uint8_t> frame;
  try {
    frame = proto::encode_request(req);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(what + ": " + e.what());
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) throw CommError(what + ": the connection failed earlier (" + broken_ + ")");
  auto deadline = Clock::now() + (server_wait.count() > 0 ? server_wait + kReplyGrace : timeout_);
  try {
    send_all(fd_.get(), frame.data(), frame.size(), deadline, address_);
    uint8_t header[4];
    recv_all(fd_.get(), header, 4, deadline, address_);
    uint32_t len = proto::get_u32(header);
    if (len < 1 || len > kMaxReplyBytes) throw CommError("reply of " + std::to_string(len) + " bytes from " + address_);
    std::string body(len, '\0');
    recv_all(fd_.get(), body.data(), len, deadline, address_);
    auto status = static_cast<proto::Status>(static_cast<uint8_t>(body[0]));
    if (status != proto::Status::ok && status != proto::Status::timeout && status != proto::Status::error) {
      throw CommError("reply with unknown status " + std::to_string(static_cast<uint8_t>(body[0])));
    }
    return Reply{status, body.substr(1)};
  } catch (const CommError& e) {
    // The stream may be out of step now; nothing more can be said on it.
    broken_ = e.what();
    fd_.reset();
    if (dynamic_cast<const TimeoutError*>(&e))
      throw TimeoutError(what + ": the store did not answer (" + e.what() + ")");
    throw CommError(what + " failed: " + e.what() + " (has rank 0 exited?)");
  }
}

void TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  auto r = request(static_cast<int>(proto::Op::set), std::chrono::milliseconds(0),
                   {key, std::string(value.begin(), value.end())});
  if (r.status != proto::Status::ok)
    throw CommError("store set of key '" + key + "' at " + address_ + " failed: " + r.payload);
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key) {
  auto r = request(static_cast<int>(proto::Op::get), timeout_, {key});
  if (r.status == proto::Status::timeout) {
    throw TimeoutError("store get of key '" + key + "' at " + address_ + " timed out after " +
                       std::to_string(timeout_.count()) + " ms: no rank set it");
  }
  if (r.status != proto::Status::ok)
    throw CommError("store get of key '" + key + "' at " + address_ + " failed: " + r.payload);
  return std::vector<uint8_t>(r.payload.begin(), r.payload.end());
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> bytes;
  proto::put_i64(bytes, delta);
  auto r = request(static_cast<int>(proto::Op::add), std::chrono::milliseconds(0),
                   {key, std::string(bytes.begin(), bytes.end())});
  if (r.status != proto::Status::ok || r.payload.size() != 8) {
    throw CommError("store add to key '" + key + "' at " + address_ + " failed: " + r.payload);
  }
  return proto::get_i64(reinterpret_cast<const uint8_t*>(r.payload.data()));
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  auto r = request(static_cast<int>(proto::Op::wait), std::max(timeout, std::chrono::milliseconds(1)), keys);
  if (r.status == proto::Status::timeout) {
    throw TimeoutError("store wait at " + address_ + " timed out after " + std::to_string(timeout.count()) +
                       " ms; still missing: " + r.payload);
  }
  if (r.status != proto::Status::ok) throw CommError("store wait at " + address_ + " failed: " + r.payload);
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  auto r = request(static_cast<int>(proto::Op::check), std::chrono::milliseconds(0), keys);
  if (r.status != proto::Status::ok || r.payload.size() != 1)
    throw CommError("store check at " + address_ + " failed: " + r.payload);
  return r.payload[0] != 0;
}

TcpStore::TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout,
                   TcpStoreServerOptions server_options, uint32_t generation)
    : port_(port) {
  if (is_server) {
    server_options.generation = generation;
    server_ = std::make_unique<TcpStoreServer>(host, port, server_options);
    port_ = server_->port();
  }
  client_ = std::make_unique<TcpStoreClient>(host, port_, timeout, std::chrono::seconds(10), generation);
}

TcpStore::~TcpStore() {
  client_.reset();  // our own connection first, so the server's linger waits only for the other ranks
  server_.reset();
}

}  // namespace zero3::bootstrap

namespace zero3 {

std::shared_ptr<Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                      std::chrono::milliseconds timeout) {
  return std::make_shared<bootstrap::TcpStore>(host, port, is_server, timeout);
}

}  // namespace zero3

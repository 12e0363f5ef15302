// The TCP store's wire format. Little-endian integers; every frame is length-prefixed and bounded so the
// server can reject a frame from its first four bytes.
//
//   handshake, both ways:   "Z3ST" u32 version u32 generation   (generation: see TcpStore; 0 = any)
//   request frame:          u32 body_len | u8 op | u32 timeout_ms | u32 field_count | (u32 len, bytes)*
//   reply frame:            u32 body_len | u8 status | payload
//
//   op     fields              ok payload
//   set    key, value          (empty)
//   get    key                 value           (waits up to timeout_ms for the key)
//   add    key, i64 delta      i64 new value   (stored as decimal text, readable with get)
//   wait   key...              (empty)         (waits up to timeout_ms for every key)
//   check  key...              u8 all present
//
// status timeout carries the missing keys as text; status error carries a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero3::bootstrap::protocol {

constexpr char kMagic[4] = {'Z', '3', 'S', 'T'};
constexpr uint32_t kVersion = 2;
constexpr size_t kHandshakeBytes = 12;

constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{1} << 20;
constexpr size_t kMaxKeysPerRequest = 1024;
constexpr size_t kRequestHeaderBytes = 1 + 4 + 4;
// The largest legal request: a set of the largest key and value.
constexpr size_t kMaxFrameBytes = kRequestHeaderBytes + 4 + kMaxKeyBytes + 4 + kMaxValueBytes;

enum class Op : uint8_t { set = 1, get = 2, add = 3, wait = 4, check = 5 };
enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

const char* op_name(Op op);

struct Request {
  Op op = Op::set;
  uint32_t timeout_ms = 0;
  std::vector<std::string> fields;  // keys, then the value (set) or the 8-byte delta (add)
};

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline void put_i64(std::vector<uint8_t>& out, int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}
inline int64_t get_i64(const uint8_t* p) {
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = u << 8 | p[i];
  return static_cast<int64_t>(u);
}

std::vector<uint8_t> handshake(uint32_t generation = 0);
bool is_handshake(const uint8_t* p);
uint32_t handshake_generation(const uint8_t* p);

// A whole request frame (length prefix included). Throws InvalidArgument for a key or value over the bounds.
std::vector<uint8_t> encode_request(const Request& request);

// Parses a request body (without its length prefix). Returns nullopt and sets `error` for anything that is
// not exactly a well-formed request within the bounds.
std::optional<Request> parse_request(const uint8_t* body, size_t size, std::string* error);

// A whole reply frame.
std::vector<uint8_t> encode_reply(Status status, const std::string& payload);

}  // namespace zero3::bootstrap::protocol

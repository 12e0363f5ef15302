#include "comm/bootstrap/store_protocol.hpp"

#include <cstring>

#include "zero3/error.hpp"

namespace zero3::bootstrap::protocol {

const char* op_name(Op op) {
  switch (op) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::add:
      return "add";
    case Op::wait:
      return "wait";
    case Op::check:
      return "check";
  }
  return "?";
}

std::vector<uint8_t> handshake(uint32_t generation) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  put_u32(out, kVersion);
  put_u32(out, generation);
  return out;
}

bool is_handshake(const uint8_t* p) { return std::memcmp(p, kMagic, 4) == 0 && get_u32(p + 4) == kVersion; }

uint32_t handshake_generation(const uint8_t* p) { return get_u32(p + 8); }

namespace {

// Number of keys each op takes, and whether a trailing value follows.
bool field_count_ok(Op op, size_t n) {
  switch (op) {
    case Op::set:
    case Op::add:
      return n == 2;
    case Op::get:
      return n == 1;
    case Op::wait:
    case Op::check:
      return n >= 1 && n <= kMaxKeysPerRequest;
  }
  return false;
}

size_t key_count(Op op, size_t fields) { return op == Op::set || op == Op::add ? 1 : fields; }

}  // namespace

std::vector<uint8_t> encode_request(const Request& request) {
  if (!field_count_ok(request.op, request.fields.size())) {
    throw InvalidArgument(std::string("store ") + op_name(request.op) + ": " + std::to_string(request.fields.size()) +
                          " fields is not a valid request (at most " + std::to_string(kMaxKeysPerRequest) + " keys)");
  }
  size_t keys = key_count(request.op, request.fields.size());
  size_t body = kRequestHeaderBytes;
  for (size_t i = 0; i < request.fields.size(); ++i) {
    const auto& f = request.fields[i];
    if (i < keys && (f.empty() || f.size() > kMaxKeyBytes)) {
      throw InvalidArgument("store key of " + std::to_string(f.size()) + " bytes: keys must be 1.." +
                            std::to_string(kMaxKeyBytes) + " bytes");
    }
    if (i >= keys && f.size() > kMaxValueBytes) {
      throw InvalidArgument("store value of " + std::to_string(f.size()) + " bytes for key '" + request.fields[0] +
                            "' exceeds the limit of " + std::to_string(kMaxValueBytes) + " bytes");
    }
    body += 4 + f.size();
  }
  if (body > kMaxFrameBytes) {
    throw InvalidArgument("store " + std::string(op_name(request.op)) + " request of " + std::to_string(body) +
                          " bytes exceeds the frame limit of " + std::to_string(kMaxFrameBytes));
  }
  std::vector<uint8_t> out;
  out.reserve(4 + body);
  put_u32(out, static_cast<uint32_t>(body));
  out.push_back(static_cast<uint8_t>(request.op));
  put_u32(out, request.timeout_ms);
  put_u32(out, static_cast<uint32_t>(request.fields.size()));
  for (const auto& f : request.fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

std::optional<Request> parse_request(const uint8_t* body, size_t size, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<Request> {
    *error = std::move(why);
    return std::nullopt;
  };
  if (size < kRequestHeaderBytes) return fail("request of " + std::to_string(size) + " bytes is too short");
  uint8_t op_byte = body[0];
  if (op_byte < 1 || op_byte > 5) return fail("unknown operation code " + std::to_string(op_byte));
  Request req;
  req.op = static_cast<Op>(op_byte);
  req.timeout_ms = get_u32(body + 1);
  uint32_t n = get_u32(body + 5);
  if (!field_count_ok(req.op, n)) {
    return fail(std::string(op_name(req.op)) + " with " + std::to_string(n) + " fields");
  }
  size_t keys = key_count(req.op, n);
  size_t pos = kRequestHeaderBytes;
  req.fields.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (size - pos < 4) return fail("field " + std::to_string(i) + " runs past the frame");
    uint32_t len = get_u32(body + pos);
    pos += 4;
    if (len > size - pos)
      return fail("field " + std::to_string(i) + " of " + std::to_string(len) + " bytes runs past the frame");
    if (i < keys && (len == 0 || len > kMaxKeyBytes)) return fail("key of " + std::to_string(len) + " bytes");
    if (i >= keys && len > kMaxValueBytes) return fail("value of " + std::to_string(len) + " bytes");
    req.fields.emplace_back(reinterpret_cast<const char*>(body + pos), len);
    pos += len;
  }
  if (req.op == Op::add && req.fields[1].size() != 8)
    return fail("add delta of " + std::to_string(req.fields[1].size()) + " bytes");
  if (pos != size) return fail(std::to_string(size - pos) + " trailing bytes after the last field");
  return req;
}

std::vector<uint8_t> encode_reply(Status status, const std::string& payload) {
  std::vector<uint8_t> out;
  out.reserve(5 + payload.size());
  put_u32(out, static_cast<uint32_t>(1 + payload.size()));
  out.push_back(static_cast<uint8_t>(status));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace zero3::bootstrap::protocol

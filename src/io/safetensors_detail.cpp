#include "io/safetensors_detail.hpp"

#include <limits>

namespace zero3::safetensors::detail {

std::string printable(std::string_view name, bool ascii_only) {
  constexpr size_t kMaxShown = 200;
  static const char* kHex = "0123456789abcdef";
  std::string out = "'";
  size_t shown = 0;
  for (char ch : name) {
    if (shown == kMaxShown) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || (ascii_only && c >= 0x80) || c == '\\' || c == '\'') {
      if (c == '\\' || c == '\'') {
        out += '\\';
        out += ch;
      } else {
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
    } else {
      out += ch;
    }
    ++shown;
  }
  out += "'";
  return out;
}

std::string short_shape(const std::vector<int64_t>& shape) {
  constexpr size_t kMaxDims = 16;
  if (shape.size() <= kMaxDims) return shape_string(shape);
  std::string out = "[";
  for (size_t i = 0; i < kMaxDims; ++i) out += std::to_string(shape[i]) + ", ";
  return out + "..., " + std::to_string(shape.size()) + " dims]";
}

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

std::optional<uint64_t> checked_bits(int64_t numel, int bits) {
  uint64_t out;
  if (numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(bits), &out)) {
    return std::nullopt;
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

}  // namespace zero3::safetensors::detail

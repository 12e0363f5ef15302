#include "checkpoint/crc32c.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "io/file_util.hpp"
#include "zero3/crc32c.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

namespace zero3::ckpt {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

// Tables for eight bytes at a time: table[k][b] is the CRC of byte b followed by k zero bytes.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// Works on the raw register (no pre/post inversion).
uint32_t crc_software(uint32_t c, const unsigned char* p, size_t n) {
  const Tables& T = tables();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = T.t[7][w & 0xFF] ^ T.t[6][(w >> 8) & 0xFF] ^ T.t[5][(w >> 16) & 0xFF] ^ T.t[4][(w >> 24) & 0xFF] ^
        T.t[3][(w >> 32) & 0xFF] ^ T.t[2][(w >> 40) & 0xFF] ^ T.t[1][(w >> 48) & 0xFF] ^ T.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ T.t[0][(c ^ *p++) & 0xFF];
  return c;
}

// Polynomial arithmetic modulo the CRC polynomial, bit-reflected (x^0 is the top bit), as zlib's combine.
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

const std::array<uint32_t, 64>& x2n_table() {
  static const std::array<uint32_t, 64> table = [] {
    std::array<uint32_t, 64> t{};
    uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (size_t n = 1; n < t.size(); ++n) t[n] = p = multmodp(p, p);
    return t;
  }();
  return table;
}

// x^(8 * bytes) mod P.
uint32_t x8nmodp(uint64_t bytes) {
  uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;
  while (bytes) {
    if (bytes & 1) p = multmodp(x2n_table()[k & 63], p);
    bytes >>= 1;
    ++k;
  }
  return p;
}

#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_FEATURE_CRC32))
#define ZERO3_CRC_HW 1

#if defined(__x86_64__)
#define ZERO3_CRC_TARGET __attribute__((target("sse4.2")))
ZERO3_CRC_TARGET inline uint32_t hw8(uint32_t c, uint64_t w) { return static_cast<uint32_t>(_mm_crc32_u64(c, w)); }
ZERO3_CRC_TARGET inline uint32_t hw1(uint32_t c, unsigned char b) { return _mm_crc32_u8(c, b); }
#else
#define ZERO3_CRC_TARGET
inline uint32_t hw8(uint32_t c, uint64_t w) { return __crc32cd(c, w); }
inline uint32_t hw1(uint32_t c, unsigned char b) { return __crc32cb(c, b); }
#endif

// Three independent streams hide the instruction's latency (3 cycles, one issued per cycle); their CRCs are
// joined by shifting with precomputed powers of x.
constexpr size_t kLane = 4096;

ZERO3_CRC_TARGET uint32_t crc_hardware(uint32_t c, const unsigned char* p, size_t n) {
  static const uint32_t shift1 = x8nmodp(kLane), shift2 = x8nmodp(2 * kLane);
  while (n >= 3 * kLane) {
    uint32_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t a, b, d;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kLane + i, 8);
      std::memcpy(&d, p + 2 * kLane + i, 8);
      c0 = hw8(c0, a);
      c1 = hw8(c1, b);
      c2 = hw8(c2, d);
    }
    c = multmodp(shift2, c0) ^ multmodp(shift1, c1) ^ c2;
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = hw8(c, w);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = hw1(c, *p++);
  return c;
}

bool detect_hardware() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return true;
#endif
}
#endif

}  // namespace

bool crc32c_hardware() {
#ifdef ZERO3_CRC_HW
  static const bool hw = detect_hardware();
  return hw;
#else
  return false;
#endif
}

uint32_t crc32c_update(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#ifdef ZERO3_CRC_HW
  if (crc32c_hardware()) return ~crc_hardware(c, p, size);
#endif
  return ~crc_software(c, p, size);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  return multmodp(x8nmodp(size_b), crc_a) ^ crc_b;
}

FileChecksum checksum_file(const std::filesystem::path& path) {
  io::FileDescriptor fd = io::open_read(path);
  FileChecksum out;
  out.size = io::file_size(fd.get(), path);
  constexpr size_t kBlock = size_t{8} << 20;
  std::vector<unsigned char> buf(std::min<uint64_t>(kBlock, out.size));
  for (uint64_t off = 0; off < out.size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, out.size - off));
    io::pread_exact(fd.get(), buf.data(), n, off, path);
    out.crc32c = crc32c_update(out.crc32c, buf.data(), n);
    off += n;
  }
  return out;
}

}  // namespace zero3::ckpt

namespace zero3 {

uint32_t crc32c(const void* data, size_t size, uint32_t crc) { return ckpt::crc32c_update(crc, data, size); }

}  // namespace zero3

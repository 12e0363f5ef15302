// Block quantization (src/kernels/block_quantize.hpp) on the CPU: the message layout byte by byte, the int4
// packing order, the rounding (ties to even, values on the grid exact), the error bound of every element
// against its block's scale, zero, tiny and non-finite blocks, odd sizes and partial blocks, several chunks
// at once, the two shapes the engine will use (an all-gather of messages; a two-stage all-to-all
// reduction), argument errors, and the AVX-512 and AVX2 bodies against the scalar reference bit for bit.
//
// Expectations are computed here from the message bytes with code written for the test (nibbles decoded by
// hand), not through the library's own decode functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "device/device_kernels.hpp"
#include "kernels/block_quantize_cpu.hpp"
#include "support/stream_path_device.hpp"
#include "zero3/device.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};
const CpuIsa kIsas[] = {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512};

// Bytes of v in type t (the dtype.hpp conversions) and the values those bytes hold, as fp32.
struct Typed {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Typed make_typed(const std::vector<float>& v, DType t) {
  Typed out{std::vector<uint8_t>(v.size() * dtype_size(t)), std::vector<float>(v.size())};
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out.bytes[i * 4], &v[i], 4);
      out.values[i] = v[i];
    } else {
      uint16_t h = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(&out.bytes[i * 2], &h, 2);
      out.values[i] = t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

float element_of(const std::vector<uint8_t>& bytes, DType t, size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// A message read with the test's own decoding of the layout.
struct Message {
  const uint8_t* p;
  int64_t n;
  QuantFormat f;

  int64_t scales_offset() const {
    int64_t code_bytes = f.bits == 8 ? n : (n + 1) / 2;
    return (code_bytes + 3) / 4 * 4;
  }
  float scale(int64_t b) const {
    float s;
    std::memcpy(&s, p + scales_offset() + 4 * b, 4);
    return s;
  }
  int code(int64_t i) const {
    if (f.bits == 8) return static_cast<int8_t>(p[i]);
    int nibble = i % 2 == 0 ? p[i / 2] >> 4 : p[i / 2] & 0xf;
    return nibble >= 8 ? nibble - 16 : nibble;
  }
  float value(int64_t i) const { return static_cast<float>(code(i)) * scale(i / f.block); }
};

std::vector<uint8_t> quantize_bytes(const Typed& x, DType t, int64_t chunk, int64_t chunks, QuantFormat f,
                                    CpuIsa isa = CpuIsa::scalar) {
  std::vector<uint8_t> out(static_cast<size_t>(chunks * quant_message_bytes(chunk, f)), 0xab);
  quantize_cpu(out.data(), x.bytes.data(), t, chunk, chunks, f, isa);
  return out;
}

std::vector<uint8_t> dequantize_bytes(const std::vector<uint8_t>& m, DType t, int64_t chunk, int64_t chunks,
                                      QuantFormat f, CpuIsa isa = CpuIsa::scalar) {
  std::vector<uint8_t> out(static_cast<size_t>(chunk * chunks) * dtype_size(t), 0xcd);
  dequantize_cpu(out.data(), t, m.data(), chunk, chunks, f, isa);
  return out;
}

// Values with a magnitude of its own per block (log-uniform over [10^lo, 10^hi]), signs mixed, a few exact
// zeros, so that every block has a different scale.
std::vector<float> block_values(int64_t n, int64_t block, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(lo, hi);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  float magnitude = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % block == 0) magnitude = static_cast<float>(std::pow(10.0, exponent(rng)));
    v[static_cast<size_t>(i)] = (rng() % 17 == 0) ? 0.0f : normal(rng) * magnitude;
  }
  return v;
}

// The exponent range a type's blocks use here (f16 is narrow: its values stay normal and finite).
std::pair<double, double> magnitude_range(DType t) {
  if (t == DType::f16) return {-3.0, 3.0};
  return {-30.0, 30.0};
}

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kIsas) {
    if (cpu_isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(BlockQuantize, MessageLayout) {
  // codes, padding to 4 bytes, one fp32 scale per block.
  EXPECT_EQ(quant_message_bytes(5, {8, 2}), 8 + 3 * 4);
  EXPECT_EQ(quant_message_bytes(5, {4, 2}), 4 + 3 * 4);
  EXPECT_EQ(quant_message_bytes(8, {4, 8}), 4 + 4);
  EXPECT_EQ(quant_message_bytes(4096, {8, 2048}), 4096 + 8);
  EXPECT_EQ(quant_message_bytes(4097, {4, 2048}), 2052 + 12);
  EXPECT_EQ(quant_message_bytes(1, {8, 2048}), 4 + 4);
  EXPECT_EQ(quant_message_bytes(0, {8, 2048}), 0);
  for (int64_t n : {1, 2, 3, 5, 7, 1000, 4097}) {
    for (QuantFormat f : {QuantFormat{8, 1}, QuantFormat{8, 3}, QuantFormat{4, 2}, QuantFormat{4, 2048}}) {
      EXPECT_EQ(quant_message_bytes(n, f) % 4, 0) << n << " elements, int" << f.bits << ", block " << f.block;
    }
  }
}

TEST(BlockQuantize, Int8BytesOnTheGrid) {
  // step 2^-3: amax = 127/8 makes the scale exactly 1/8 and the factor exactly 8.
  const float s = 0.125f;
  std::vector<float> v = {1 * s, -2 * s, 127 * s, -127 * s, 0.0f};
  Typed x = make_typed(v, DType::f32);
  QuantFormat f{8, 4};
  std::vector<uint8_t> m = quantize_bytes(x, DType::f32, 5, 1, f);
  ASSERT_EQ(m.size(), 8u + 2 * 4);
  const uint8_t codes[] = {0x01, 0xfe, 0x7f, 0x81, 0x00, 0x00, 0x00, 0x00};  // two's complement, then padding
  EXPECT_EQ(std::memcmp(m.data(), codes, 8), 0);
  float scales[2];
  std::memcpy(scales, m.data() + 8, 8);
  EXPECT_EQ(scales[0], s);
  EXPECT_EQ(f32_bits(scales[1]), 0u);  // the partial block holds one zero
  std::vector<uint8_t> back = dequantize_bytes(m, DType::f32, 5, 1, f);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(f32_bits(element_of(back, DType::f32, i)), f32_bits(v[i])) << i;
}

TEST(BlockQuantize, Int4PackingOrder) {
  // Element 2j in the high nibble of byte j, element 2j+1 in the low nibble; an odd count leaves the last
  // low nibble zero. Step 1/4: amax = 7/4.
  const float s = 0.25f;
  std::vector<float> v = {1 * s, -2 * s, 7 * s, -7 * s, 3 * s};
  Typed x = make_typed(v, DType::f32);
  QuantFormat f{4, 6};
  std::vector<uint8_t> m = quantize_bytes(x, DType::f32, 5, 1, f);
  ASSERT_EQ(m.size(), 4u + 4);
  const uint8_t codes[] = {0x1e, 0x79, 0x30, 0x00};  // (1, -2), (7, -7), (3, none), padding
  EXPECT_EQ(std::memcmp(m.data(), codes, 4), 0) << std::hex << int(m[0]) << " " << int(m[1]) << " " << int(m[2]);
  float scale;
  std::memcpy(&scale, m.data() + 4, 4);
  EXPECT_EQ(scale, s);
  std::vector<uint8_t> back = dequantize_bytes(m, DType::f32, 5, 1, f);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(element_of(back, DType::f32, i), v[i]) << i;
}

TEST(BlockQuantize, ValuesOnTheGridRoundTripExactly) {
  // Per block a power-of-two step 2^e and amax = qmax * 2^e: scale and factor are exact, so every multiple
  // k * 2^e (|k| <= qmax) comes back bit for bit, in fp32 and in the source type.
  std::mt19937_64 rng(7);
  for (int bits : {8, 4}) {
    const int qmax = bits == 8 ? 127 : 7;
    for (DType t : kTypes) {
      for (int64_t block : {2, 6, 64, 2048}) {
        const int64_t n = 3 * block + block / 2;  // a partial last block
        std::vector<float> v(static_cast<size_t>(n));
        std::vector<float> step(static_cast<size_t>(quant_blocks(n, block)));
        for (int64_t b = 0; b < quant_blocks(n, block); ++b) {
          int e = t == DType::f16 ? static_cast<int>(rng() % 20) - 14 : static_cast<int>(rng() % 120) - 60;
          step[static_cast<size_t>(b)] = std::ldexp(1.0f, e);
          for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
            int k = static_cast<int>(rng() % (2 * qmax + 1)) - qmax;
            v[static_cast<size_t>(i)] = static_cast<float>(k) * step[static_cast<size_t>(b)];
          }
          v[static_cast<size_t>(b * block)] = (b % 2 ? -qmax : qmax) * step[static_cast<size_t>(b)];
        }
        Typed x = make_typed(v, t);
        ASSERT_EQ(x.values, v) << "test values must be exact in " << dtype_name(t);
        QuantFormat f{bits, block};
        std::vector<uint8_t> m = quantize_bytes(x, t, n, 1, f);
        Message msg{m.data(), n, f};
        for (int64_t b = 0; b < quant_blocks(n, block); ++b) {
          ASSERT_EQ(msg.scale(b), step[static_cast<size_t>(b)]) << "int" << bits << " block " << b;
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(static_cast<float>(msg.code(i)) * step[static_cast<size_t>(i / block)], v[static_cast<size_t>(i)]);
        }
        for (DType out : kTypes) {
          std::vector<uint8_t> back = dequantize_bytes(m, out, n, 1, f);
          Typed want = make_typed(v, out);
          ASSERT_EQ(back, want.bytes) << "int" << bits << " " << dtype_name(t) << " -> " << dtype_name(out)
                                      << ", block " << block;
        }
      }
    }
  }
}

TEST(BlockQuantize, TiesRoundToEven) {
  // amax = qmax makes scale and factor 1, so x * inv is x itself.
  struct Case {
    int bits;
    float x;
    int code;
  };
  const Case cases[] = {{8, 0.5f, 0},   {8, 1.5f, 2},     {8, 2.5f, 2},        {8, -0.5f, 0}, {8, -1.5f, -2},
                        {8, -2.5f, -2}, {8, 126.5f, 126}, {8, 0.49999997f, 0}, {4, 5.5f, 6},  {4, 6.5f, 6},
                        {4, -6.5f, -6}, {4, 4.5f, 4},     {4, -0.5f, 0}};
  for (const Case& c : cases) {
    const float qmax = c.bits == 8 ? 127.0f : 7.0f;
    std::vector<float> v = {qmax, c.x};
    QuantFormat f{c.bits, 2};
    std::vector<uint8_t> m = quantize_bytes(make_typed(v, DType::f32), DType::f32, 2, 1, f);
    Message msg{m.data(), 2, f};
    EXPECT_EQ(msg.scale(0), 1.0f);
    EXPECT_EQ(msg.code(1), c.code) << "int" << c.bits << " x = " << c.x;
  }
}

// Half a step of a block plus the fp32 roundings: the bound of one dequantized element.
double max_error(float scale, const QuantFormat& f) {
  return scale * (0.5 + (f.bits == 8 ? 127 : 7) * std::ldexp(1.0, -21));
}

// The bound of every element: |x - float(q) * scale| <= scale/2 + amax * 2^-21, scale = fl(amax / qmax), codes
// in [-qmax, qmax]; the 16-bit results are the rounding of the fp32 one.
void expect_bound(const Typed& x, int64_t n, const QuantFormat& f, const std::vector<uint8_t>& m,
                  const std::string& what) {
  const int qmax = f.bits == 8 ? 127 : 7;
  Message msg{m.data(), n, f};
  std::vector<uint8_t> f32 = dequantize_bytes(m, DType::f32, n, 1, f);
  for (int64_t b = 0; b < quant_blocks(n, f.block); ++b) {
    const int64_t begin = b * f.block;
    const int64_t end = std::min(n, begin + f.block);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x.values[static_cast<size_t>(i)]));
    const float scale = msg.scale(b);
    if (amax < qmax * std::ldexp(1.0f, -126)) {
      ASSERT_EQ(f32_bits(scale), 0u) << what << " block " << b;
    } else {
      ASSERT_EQ(scale, amax / static_cast<float>(qmax)) << what << " block " << b;
    }
    const double bound = scale / 2.0 + amax * std::ldexp(1.0, -21);
    for (int64_t i = begin; i < end; ++i) {
      const float xi = x.values[static_cast<size_t>(i)];
      const float y = element_of(f32, DType::f32, static_cast<size_t>(i));
      ASSERT_LE(std::abs(msg.code(i)), qmax) << what << " element " << i;
      ASSERT_EQ(f32_bits(y), f32_bits(msg.value(i))) << what << " element " << i;
      ASSERT_LE(std::fabs(static_cast<double>(xi) - y), bound)
          << what << " element " << i << ": x = " << xi << ", dequantized " << y << ", scale " << scale;
    }
  }
  for (DType out : {DType::bf16, DType::f16}) {
    std::vector<uint8_t> back = dequantize_bytes(m, out, n, 1, f);
    std::vector<float> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = element_of(f32, DType::f32, static_cast<size_t>(i));
    ASSERT_EQ(back, make_typed(y, out).bytes) << what << " -> " << dtype_name(out);
  }
}

TEST(BlockQuantize, ErrorBoundPerBlockOddSizesAndPartialBlocks) {
  uint64_t seed = 1;
  for (int bits : {8, 4}) {
    for (DType t : kTypes) {
      for (int64_t block : {1, 2, 6, 64, 100, 2048}) {
        if (bits == 4 && block % 2 != 0) continue;
        for (int64_t n : {1, 2, 3, 7, 31, 33, 2047, 2049, 10007}) {
          auto [lo, hi] = magnitude_range(t);
          Typed x = make_typed(block_values(n, block, seed++, lo, hi), t);
          QuantFormat f{bits, block};
          std::vector<uint8_t> m = quantize_bytes(x, t, n, 1, f);
          expect_bound(x, n, f, m,
                       "int" + std::to_string(bits) + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n) +
                           " block=" + std::to_string(block));
        }
      }
    }
  }
}

TEST(BlockQuantize, LargestMagnitudeIsExactAndCodesAreSymmetric) {
  // The element of largest magnitude maps to +-qmax; -128 and -8 are never produced.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int bits : {8, 4}) {
    const int qmax = bits == 8 ? 127 : 7;
    std::vector<float> v(4096);
    for (float& e : v) e = normal(rng);
    v[100] = -50.0f;  // the block's amax, negative
    QuantFormat f{bits, 4096};
    std::vector<uint8_t> m = quantize_bytes(make_typed(v, DType::f32), DType::f32, 4096, 1, f);
    Message msg{m.data(), 4096, f};
    EXPECT_EQ(msg.code(100), -qmax);
    for (int64_t i = 0; i < 4096; ++i) ASSERT_GE(msg.code(i), -qmax);
  }
}

TEST(BlockQuantize, ZeroAndTinyBlocks) {
  for (int bits : {8, 4}) {
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    const float threshold = qmax * std::ldexp(1.0f, -126);
    QuantFormat f{bits, 4};
    // Block 0: zeros of both signs. Block 1: amax just below qmax * 2^-126. Block 2: amax exactly there, on
    // the grid of step 2^-126 (exact). Block 3: a subnormal alone.
    const float below = std::nextafter(threshold, 0.0f);
    const float step = std::ldexp(1.0f, -126);
    std::vector<float> v = {0.0f,
                            -0.0f,
                            0.0f,
                            -0.0f,
                            below,
                            -below / 2,
                            0.0f,
                            1e-40f,
                            threshold,
                            -2 * step,
                            3 * step,
                            0.0f,
                            std::ldexp(1.0f, -140),
                            0.0f,
                            0.0f,
                            0.0f};
    Typed x = make_typed(v, DType::f32);
    std::vector<uint8_t> m = quantize_bytes(x, DType::f32, 16, 1, f);
    Message msg{m.data(), 16, f};
    EXPECT_EQ(f32_bits(msg.scale(0)), 0u);
    EXPECT_EQ(f32_bits(msg.scale(1)), 0u);
    EXPECT_EQ(msg.scale(2), step);
    EXPECT_EQ(f32_bits(msg.scale(3)), 0u);
    std::vector<uint8_t> back = dequantize_bytes(m, DType::f32, 16, 1, f);
    for (size_t i : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 12u}) {
      EXPECT_EQ(f32_bits(element_of(back, DType::f32, i)), 0u) << "element " << i << " must come back as +0";
    }
    for (size_t i : {8u, 9u, 10u, 11u}) EXPECT_EQ(element_of(back, DType::f32, i), v[i]) << "element " << i;
    for (int64_t i = 0; i < 16; ++i) {
      if (i < 8 || i >= 12) {
        EXPECT_EQ(msg.code(i), 0) << "element " << i;
      }
    }
  }
}

TEST(BlockQuantize, NonFiniteValuesPoisonTheirBlockOnly) {
  // An Inf or NaN anywhere in a block makes its scale NaN and its codes 0: every element of that block
  // comes back NaN (so an overflow check counting Inf/NaN fires), the other blocks are untouched.
  auto cpu = make_cpu_device();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int bits : {8, 4}) {
    for (DType t : kTypes) {
      for (float bad : {nan, inf, -inf, 1e6f}) {  // 1e6 overflows f16 to Inf
        if (bad == 1e6f && t != DType::f16) continue;
        const int64_t block = 64;
        const int64_t n = 3 * block - 10;
        std::vector<float> v = block_values(n, block, 11, -2.0, 2.0);
        std::vector<float> clean = v;
        v[block + 17] = bad;
        QuantFormat f{bits, block};
        Typed x = make_typed(v, t);
        std::vector<uint8_t> m = quantize_bytes(x, t, n, 1, f);
        std::vector<uint8_t> m_clean = quantize_bytes(make_typed(clean, t), t, n, 1, f);
        Message msg{m.data(), n, f};
        Message msg_clean{m_clean.data(), n, f};
        const std::string what =
            "int" + std::to_string(bits) + " " + std::string(dtype_name(t)) + " with " + std::to_string(bad);
        EXPECT_TRUE(std::isnan(msg.scale(1))) << what;
        for (int64_t i = block; i < 2 * block; ++i) ASSERT_EQ(msg.code(i), 0) << what;
        for (int64_t b : {0, 2}) EXPECT_EQ(msg.scale(b), msg_clean.scale(b)) << what;
        for (int64_t i = 0; i < n; ++i) {
          if (i < block || i >= 2 * block) {
            ASSERT_EQ(msg.code(i), msg_clean.code(i)) << what << " element " << i;
          }
        }
        for (DType out : kTypes) {
          std::vector<uint8_t> back = dequantize_bytes(m, out, n, 1, f);
          for (int64_t i = 0; i < n; ++i) {
            bool in_bad_block = i >= block && i < 2 * block;
            ASSERT_EQ(std::isnan(element_of(back, out, static_cast<size_t>(i))), in_bad_block)
                << what << " -> " << dtype_name(out) << " element " << i;
          }
          detail::GradStats stats = detail::kernels_of(*cpu).grad_stats(back.data(), out, n);
          EXPECT_EQ(stats.non_finite, block) << what << " -> " << dtype_name(out);
        }
        // The reduction carries it too: a NaN block in one message is a NaN block of the sum.
        std::vector<uint8_t> two = m_clean;
        two.insert(two.end(), m.begin(), m.end());
        std::vector<float> sum(static_cast<size_t>(n));
        dequantize_sum_cpu(sum.data(), two.data(), n, 2, f);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::isnan(sum[static_cast<size_t>(i)]), i >= block && i < 2 * block) << what << " sum " << i;
        }
      }
    }
  }
}

TEST(BlockQuantize, ChunksAreIndependentMessagesBackToBack) {
  for (int bits : {8, 4}) {
    for (DType t : kTypes) {
      const int64_t chunk = 1001;  // odd: int4 messages end on a half-used byte
      const int64_t chunks = 5;
      QuantFormat f{bits, 64};
      auto [lo, hi] = magnitude_range(t);
      Typed x = make_typed(block_values(chunk * chunks, 50, 21, lo, hi), t);
      std::vector<uint8_t> all = quantize_bytes(x, t, chunk, chunks, f);
      const int64_t bytes = quant_message_bytes(chunk, f);
      std::vector<uint8_t> back = dequantize_bytes(all, t, chunk, chunks, f);
      for (int64_t c = 0; c < chunks; ++c) {
        Typed one;
        const size_t size = dtype_size(t);
        one.bytes.assign(x.bytes.begin() + c * chunk * size, x.bytes.begin() + (c + 1) * chunk * size);
        std::vector<uint8_t> m = quantize_bytes(one, t, chunk, 1, f);
        ASSERT_EQ(std::memcmp(m.data(), all.data() + c * bytes, static_cast<size_t>(bytes)), 0)
            << "int" << bits << " " << dtype_name(t) << " chunk " << c;
        std::vector<uint8_t> one_back = dequantize_bytes(m, t, chunk, 1, f);
        ASSERT_EQ(std::memcmp(one_back.data(), back.data() + c * chunk * size, one_back.size()), 0);
      }
    }
  }
}

TEST(BlockQuantize, DequantizeSumAddsMessagesInOrderInFp32) {
  for (int bits : {8, 4}) {
    for (int64_t chunks : {0, 1, 2, 7}) {
      const int64_t chunk = 777;
      QuantFormat f{bits, 32};
      Typed x = make_typed(block_values(chunk * std::max<int64_t>(chunks, 1), 16, 31 + chunks, -3.0, 3.0), DType::f32);
      std::vector<uint8_t> m(static_cast<size_t>(std::max<int64_t>(chunks, 1) * quant_message_bytes(chunk, f)));
      quantize_cpu(m.data(), x.bytes.data(), DType::f32, chunk, std::max<int64_t>(chunks, 1), f);
      std::vector<float> sum(static_cast<size_t>(chunk), -1.0f);
      dequantize_sum_cpu(sum.data(), m.data(), chunk, chunks, f);
      for (int64_t i = 0; i < chunk; ++i) {
        float want = 0.0f;
        for (int64_t c = 0; c < chunks; ++c) {
          want += Message{m.data() + c * quant_message_bytes(chunk, f), chunk, f}.value(i);
        }
        ASSERT_EQ(f32_bits(sum[static_cast<size_t>(i)]), f32_bits(want)) << "int" << bits << " chunks " << chunks;
      }
    }
  }
}

TEST(BlockQuantize, AllGatherShape) {
  // qwZ: each of W ranks quantizes its slice of S bf16 weights into one message; the all-gather lays the W
  // messages back to back; one dequantize fills the unit's full 16-bit buffer.
  const int64_t w = 4;
  const int64_t s = 3000;
  QuantFormat f{8, 2048};
  std::vector<uint8_t> gathered;
  std::vector<float> original;
  for (int64_t r = 0; r < w; ++r) {
    Typed slice = make_typed(block_values(s, 700, 40 + r, -3.0, 0.0), DType::bf16);
    original.insert(original.end(), slice.values.begin(), slice.values.end());
    std::vector<uint8_t> m = quantize_bytes(slice, DType::bf16, s, 1, f);
    gathered.insert(gathered.end(), m.begin(), m.end());
  }
  std::vector<uint8_t> full = dequantize_bytes(gathered, DType::bf16, s, w, f);
  for (int64_t r = 0; r < w; ++r) {
    Message msg{gathered.data() + r * quant_message_bytes(s, f), s, f};
    for (int64_t i = 0; i < s; ++i) {
      const float x = original[static_cast<size_t>(r * s + i)];
      const float y = element_of(full, DType::bf16, static_cast<size_t>(r * s + i));
      // the fp32 bound, plus half an ulp of bf16 (2^-8 relative) for the final rounding
      const double bound = max_error(msg.scale(i / f.block), f) + std::fabs(y) * std::ldexp(1.0, -8) * 1.01;
      ASSERT_LE(std::fabs(static_cast<double>(x) - y), bound) << "rank " << r << " element " << i;
    }
  }
}

TEST(BlockQuantize, TwoStageReductionShape) {
  // qgZ on 2 nodes x 2 ranks: each rank cuts its gradient bucket into one chunk per local peer (in the
  // order that makes each peer's part hold, node by node, what its counterparts on the other nodes own),
  // int4; each rank sums what it received in fp32 and re-quantizes it per node for the inter-node
  // all-to-all; the final sums are each rank's slice. Checked against the exact sum with the bound the
  // scales of both stages give.
  const int nodes = 2, local = 2, world = nodes * local;
  const int64_t slice = 1500;
  QuantFormat f{4, 256};
  std::vector<std::vector<float>> grads(world);
  for (int g = 0; g < world; ++g) grads[g] = block_values(world * slice, 300, 50 + g, -2.0, 1.0);
  // Bucket of rank g laid out by destination local rank l, then node n: part (l, n) = slice of rank n*local+l.
  auto swizzled = [&](int g) {
    std::vector<float> out;
    for (int l = 0; l < local; ++l) {
      for (int n = 0; n < nodes; ++n) {
        const float* p = grads[g].data() + (n * local + l) * slice;
        out.insert(out.end(), p, p + slice);
      }
    }
    return out;
  };
  const int64_t part1 = nodes * slice;  // stage 1 chunk
  const int64_t bytes1 = quant_message_bytes(part1, f);
  std::vector<std::vector<uint8_t>> sent1(world);
  for (int g = 0; g < world; ++g)
    sent1[g] = quantize_bytes(make_typed(swizzled(g), DType::f32), DType::f32, part1, local, f);
  // Intra-node all-to-all, then sum: rank (n, l) receives chunk l from each rank of node n.
  std::vector<std::vector<float>> partial(world, std::vector<float>(static_cast<size_t>(part1)));
  std::vector<std::vector<uint8_t>> received1(world);
  for (int g = 0; g < world; ++g) {
    const int n = g / local, l = g % local;
    for (int peer = 0; peer < local; ++peer) {
      const uint8_t* m = sent1[n * local + peer].data() + l * bytes1;
      received1[g].insert(received1[g].end(), m, m + bytes1);
    }
    dequantize_sum_cpu(partial[g].data(), received1[g].data(), part1, local, f);
  }
  // Inter-node: rank (n, l) sends part n' of its partial sum to rank (n', l).
  const int64_t bytes2 = quant_message_bytes(slice, f);
  std::vector<std::vector<uint8_t>> sent2(world);
  for (int g = 0; g < world; ++g) {
    sent2[g] = quantize_bytes(make_typed(partial[g], DType::f32), DType::f32, slice, nodes, f);
  }
  for (int g = 0; g < world; ++g) {
    const int n = g / local, l = g % local;
    std::vector<uint8_t> received2;
    for (int src_node = 0; src_node < nodes; ++src_node) {
      const uint8_t* m = sent2[src_node * local + l].data() + n * bytes2;
      received2.insert(received2.end(), m, m + bytes2);
    }
    std::vector<float> result(static_cast<size_t>(slice));
    dequantize_sum_cpu(result.data(), received2.data(), slice, nodes, f);
    for (int64_t i = 0; i < slice; ++i) {
      double exact = 0.0;
      for (int r = 0; r < world; ++r) exact += grads[r][static_cast<size_t>(g * slice + i)];
      // Stage 1: the local peers' messages covering element i (at offset n*slice + i of chunk l), each off by
      // at most half its block's step; stage 2: the two inter-node messages, likewise; plus fp32 sums.
      double bound = 0.0;
      for (int src_node = 0; src_node < nodes; ++src_node) {
        const int sender = src_node * local + l;
        for (int peer = 0; peer < local; ++peer) {
          Message m1{received1[sender].data() + peer * bytes1, part1, f};
          bound += max_error(m1.scale((n * slice + i) / f.block), f);
        }
        Message m2{sent2[sender].data() + n * bytes2, slice, f};
        bound += max_error(m2.scale(i / f.block), f);
      }
      double magnitude = 0.0;  // the fp32 additions round at most 2^-24 of what they add up
      for (int r = 0; r < world; ++r) magnitude += std::fabs(grads[r][static_cast<size_t>(g * slice + i)]);
      bound += magnitude * 1e-6;
      ASSERT_LE(std::fabs(result[static_cast<size_t>(i)] - exact), bound) << "rank " << g << " element " << i;
    }
  }
}

// Random bit patterns (so Inf, NaN, subnormals), wide magnitudes, zero blocks and blocks of one value.
std::vector<float> hostile_values(int64_t n, int64_t block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  int kind = 0;
  float magnitude = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % block == 0) {
      kind = static_cast<int>(rng() % 8);
      magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
    }
    float& e = v[static_cast<size_t>(i)];
    switch (kind) {
      case 0:
        e = f32_from_bits(static_cast<uint32_t>(rng()));
        break;
      case 1:
        e = 0.0f;
        break;
      case 2:
        e = magnitude;
        break;
      case 3:
        e = f32_from_bits(static_cast<uint32_t>(rng()) & 0x807fffffu);  // subnormals
        break;
      default:
        e = normal(rng) * magnitude;
    }
  }
  return v;
}

TEST(BlockQuantize, VectorBodiesMatchTheScalarReferenceBitForBit) {
  std::vector<CpuIsa> isas = supported_isas();
  std::printf("block quantization ISAs on this CPU: ");
  for (CpuIsa isa : isas) std::printf("%s ", std::string(cpu_isa_name(isa)).c_str());
  std::printf("\n");
  uint64_t seed = 100;
  for (int bits : {8, 4}) {
    for (DType t : kTypes) {
      for (int64_t block : {2, 14, 16, 34, 2048}) {
        for (int64_t chunk : {1, 15, 17, 33, 4097, 70001}) {
          const int64_t chunks = chunk > 10000 ? 1 : 3;
          QuantFormat f{bits, block};
          Typed x = make_typed(hostile_values(chunk * chunks, block, seed++), t);
          std::vector<uint8_t> ref = quantize_bytes(x, t, chunk, chunks, f, CpuIsa::scalar);
          std::vector<float> ref_sum(static_cast<size_t>(chunk));
          dequantize_sum_cpu(ref_sum.data(), ref.data(), chunk, chunks, f, CpuIsa::scalar);
          for (CpuIsa isa : isas) {
            const std::string what = std::string(cpu_isa_name(isa)) + " int" + std::to_string(bits) + " " +
                                     std::string(dtype_name(t)) + " block " + std::to_string(block) + " chunk " +
                                     std::to_string(chunk);
            std::vector<uint8_t> got = quantize_bytes(x, t, chunk, chunks, f, isa);
            ASSERT_EQ(got, ref) << what;
            for (DType out : kTypes) {
              ASSERT_EQ(dequantize_bytes(ref, out, chunk, chunks, f, isa),
                        dequantize_bytes(ref, out, chunk, chunks, f, CpuIsa::scalar))
                  << what << " -> " << dtype_name(out);
            }
            std::vector<float> sum(static_cast<size_t>(chunk));
            dequantize_sum_cpu(sum.data(), ref.data(), chunk, chunks, f, isa);
            ASSERT_EQ(std::memcmp(sum.data(), ref_sum.data(), sum.size() * 4), 0) << what;
          }
        }
      }
    }
  }
}

TEST(BlockQuantize, CpuDeviceKernelsAreTheCpuDrivers) {
  auto cpu = make_cpu_device();
  detail::DeviceKernels& k = detail::kernels_of(*cpu);
  QuantFormat f{4, 128};
  const int64_t chunk = 5000, chunks = 3;
  Typed x = make_typed(block_values(chunk * chunks, 128, 77, -2.0, 2.0), DType::bf16);
  std::vector<uint8_t> want = quantize_bytes(x, DType::bf16, chunk, chunks, f, CpuIsa::best);
  std::vector<uint8_t> got(want.size());
  k.quantize(got.data(), x.bytes.data(), DType::bf16, chunk, chunks, f);
  ASSERT_EQ(got, want);
  std::vector<uint8_t> back(static_cast<size_t>(chunk * chunks) * 2);
  k.dequantize(back.data(), DType::bf16, got.data(), chunk, chunks, f);
  ASSERT_EQ(back, dequantize_bytes(want, DType::bf16, chunk, chunks, f, CpuIsa::best));
  std::vector<float> sum(static_cast<size_t>(chunk)), want_sum(static_cast<size_t>(chunk));
  k.dequantize_sum(sum.data(), got.data(), chunk, chunks, f);
  dequantize_sum_cpu(want_sum.data(), want.data(), chunk, chunks, f);
  ASSERT_EQ(sum, want_sum);
}

TEST(BlockQuantize, StreamPathDeviceQueuesTheKernelsOnTheirStream) {
  // The test device that stands in for a GPU in the engine's stream tests runs these kernels when their
  // stream runs, not when they are called.
  zero3::testing::StreamPathDevice device;
  auto stream = device.make_stream();
  QuantFormat f{8, 64};
  const int64_t chunk = 1000, chunks = 2;
  Typed x = make_typed(block_values(chunk * chunks, 64, 88, -2.0, 2.0), DType::f32);
  const size_t bytes = static_cast<size_t>(chunks * quant_message_bytes(chunk, f));
  auto* in = static_cast<uint8_t*>(device.allocate(x.bytes.size()));
  auto* messages = static_cast<uint8_t*>(device.allocate(bytes));
  auto* back = static_cast<uint8_t*>(device.allocate(x.bytes.size()));
  auto* sum = static_cast<float*>(device.allocate(static_cast<size_t>(chunk) * 4));
  device.copy(in, x.bytes.data(), x.bytes.size(), nullptr);
  device.fill_zero(messages, bytes, nullptr);
  device.kernels().quantize(messages, in, DType::f32, chunk, chunks, f, stream->get());
  device.kernels().dequantize(back, DType::f32, messages, chunk, chunks, f, stream->get());
  device.kernels().dequantize_sum(sum, messages, chunk, chunks, f, stream->get());
  EXPECT_EQ(std::vector<uint8_t>(messages, messages + bytes), std::vector<uint8_t>(bytes, 0))
      << "ran before its stream";
  stream->synchronize();
  std::vector<uint8_t> want = quantize_bytes(x, DType::f32, chunk, chunks, f);
  EXPECT_EQ(std::vector<uint8_t>(messages, messages + bytes), want);
  EXPECT_EQ(std::vector<uint8_t>(back, back + x.bytes.size()), dequantize_bytes(want, DType::f32, chunk, chunks, f));
  std::vector<float> want_sum(static_cast<size_t>(chunk));
  dequantize_sum_cpu(want_sum.data(), want.data(), chunk, chunks, f);
  EXPECT_EQ(std::vector<float>(sum, sum + chunk), want_sum);
  EXPECT_EQ(device.usage().kernels_on_host_memory, 0);
  device.deallocate(in, x.bytes.size());
  device.deallocate(messages, bytes);
  device.deallocate(back, x.bytes.size());
  device.deallocate(sum, static_cast<size_t>(chunk) * 4);
  EXPECT_EQ(device.usage().frees_while_queued, 0);
}

TEST(BlockQuantize, BadArgumentsAreNamed) {
  float x = 1.0f;
  uint8_t m[64];
  auto message_of = [&](auto&& call) {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  EXPECT_NE(message_of([&] {
              quantize_cpu(m, &x, DType::f32, 1, 1, {5, 16});
            }).find("quantize: bits = 5, expected 8 or 4"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              dequantize_cpu(&x, DType::f32, m, 1, 1, {8, 0});
            }).find("dequantize: block = 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              quantize_cpu(m, &x, DType::f32, 1, 1, {4, 3});
            }).find("block = 3 elements with int4"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              dequantize_sum_cpu(&x, m, -1, 1, {8, 16});
            }).find("dequantize_sum: chunk = -1"),
            std::string::npos);
  auto cpu = make_cpu_device();
  EXPECT_THROW(detail::kernels_of(*cpu).quantize(m, &x, DType::f32, 1, 1, {8, -4}), InvalidArgument);
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa_supported(isa)) continue;
    EXPECT_THROW(quantize_cpu(m, &x, DType::f32, 1, 1, {8, 16}, isa), Unsupported);
  }
}

}  // namespace

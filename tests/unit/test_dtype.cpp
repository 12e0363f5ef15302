#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "zero3/dtype.hpp"

using namespace zero3;

// Reference: round-to-nearest-even by exact double arithmetic on the representable neighbours.
static double nearest_even_pick(double x, double lo, double hi, bool lo_even) {
  double dlo = x - lo, dhi = hi - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return lo_even ? lo : hi;
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_FALSE(parse_dtype("int8").has_value());
}

TEST(DType, Bf16RoundsToNearestEven) {
  // Every bf16 value round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), h) << h;
  }
  // Midpoints between neighbours go to the even one; just above goes up.
  for (uint32_t h = 0x3f80; h < 0x3fa0; ++h) {
    uint32_t mid = (h << 16) | 0x8000u;
    uint16_t expect = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid)), expect);
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid + 1)), h + 1);
  }
}

TEST(DType, F16ExhaustiveAgainstReference) {
  // Round trip of every f16 value.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  // Midpoints and near-midpoints between consecutive positive finite f16 values (normal and subnormal).
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    double lo = f16_to_f32(static_cast<uint16_t>(h));
    double hi = f16_to_f32(static_cast<uint16_t>(h + 1));
    for (double t : {0.25, 0.5, 0.75}) {
      float x = static_cast<float>(lo + (hi - lo) * t);
      double picked = nearest_even_pick(x, lo, hi, (h & 1u) == 0);
      EXPECT_EQ(static_cast<double>(f16_to_f32(f32_to_f16(x))), picked) << std::hex << h << " t=" << t;
      EXPECT_EQ(f16_to_f32(f32_to_f16(-x)), -picked);
    }
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // ties up to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(1e-9f), 0);
}

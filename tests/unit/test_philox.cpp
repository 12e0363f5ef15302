// Philox4x32-10 against the published Random123 known-answer vectors, the fill's independence from how
// a parameter is sliced, and the distributions' first two moments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/philox_init.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123 kat_vectors, "philox4x32 10" lines: counter (4 words), key (2 words), result (4 words).
const Kat kKats[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, KnownAnswerVectors) {
  for (const Kat& k : kKats) {
    Philox4x32 out = philox4x32_10(Philox4x32{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(out.v[i], k.expected[i]) << "word " << i << " of ctr " << std::hex << k.ctr[0];
  }
}

TEST(Philox, CounterAndKeyLayout) {
  // seed -> key (low, high), block -> counter words 0-1, stream -> counter words 2-3.
  Philox4x32 a = philox_block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  const Kat& k = kKats[2];
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.v[i], k.expected[i]);
  Philox4x32 z = philox_block(~0ull, ~0ull, ~0ull);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(z.v[i], kKats[1].expected[i]);
}

TEST(Philox, UniformFillIsTheRawStream) {
  // seed 0, stream 0, block 0 is the all-zero known answer; uniform(0, 1) keeps the top 24 bits.
  FillSpec spec = FillSpec::uniform(0.0, 1.0);
  float out[4];
  philox_fill_cpu(spec, 0, 0, 0, 4, out);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i], static_cast<float>(kKats[0].expected[i] >> 8) * 0x1p-24f);
  }
  // uniform(-2, 6) on the same stream: -2 + 8 u, exact in float.
  FillSpec wide = FillSpec::uniform(-2.0, 6.0);
  philox_fill_cpu(wide, 0, 0, 0, 4, out);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i], -2.0f + 8.0f * (static_cast<float>(kKats[0].expected[i] >> 8) * 0x1p-24f));
  }
}

TEST(Philox, ConstantKinds) {
  std::vector<float> v(37, -1.0f);
  philox_fill_cpu(FillSpec::zeros(), 1, 2, 5, 42, v.data());
  for (float x : v) EXPECT_EQ(x, 0.0f);
  philox_fill_cpu(FillSpec::ones(), 1, 2, 5, 42, v.data());
  for (float x : v) EXPECT_EQ(x, 1.0f);
  philox_fill_cpu(FillSpec::constant(0.125), 1, 2, 5, 42, v.data());
  for (float x : v) EXPECT_EQ(x, 0.125f);
}

// Filling [0, n) at once equals filling it slice by slice, for slices as an engine cuts them (ceil(n / w)
// per rank, the last one short) and for arbitrary cuts that split blocks of four.
TEST(Philox, SliceInvariance) {
  const int64_t n = 10007;  // prime: no world size divides it
  const uint64_t seed = 1234, stream = philox_stream_id("layer.3.mlp.up.weight");
  const FillSpec specs[] = {
      FillSpec::normal(0.0, 0.02),
      FillSpec::uniform(-0.5, 0.5),
      FillSpec::constant(3.0),
  };
  for (const FillSpec& spec : specs) {
    std::vector<float> whole(n);
    philox_fill_cpu(spec, seed, stream, 0, n, whole.data());
    for (int64_t w = 1; w <= 7; ++w) {
      std::vector<float> pieces(n, -99.0f);
      int64_t slice = (n + w - 1) / w;
      for (int64_t r = 0; r < w; ++r) {
        int64_t b = std::min(n, r * slice), e = std::min(n, b + slice);
        philox_fill_cpu(spec, seed, stream, b, e, pieces.data() + b);
      }
      ASSERT_EQ(0, std::memcmp(whole.data(), pieces.data(), n * sizeof(float))) << "world size " << w;
    }
    const int64_t cuts[] = {0, 1, 2, 3, 5, 6, 7, 13, 4099, 4100, 9998, 10006, n};
    std::vector<float> pieces(n, -99.0f);
    for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
      philox_fill_cpu(spec, seed, stream, cuts[i], cuts[i + 1], pieces.data() + cuts[i]);
    }
    ASSERT_EQ(0, std::memcmp(whole.data(), pieces.data(), n * sizeof(float)));
    for (int64_t i : {0L, 1L, 4097L, n - 1}) {
      EXPECT_EQ(philox_fill_value(spec, seed, stream, static_cast<uint64_t>(i)), whole[i]) << i;
    }
  }
}

TEST(Philox, StreamsAndSeedsDiffer) {
  const int64_t n = 64;
  FillSpec spec = FillSpec::normal(0.0, 1.0);
  std::vector<float> a(n), b(n), c(n);
  philox_fill_cpu(spec, 7, philox_stream_id("a"), 0, n, a.data());
  philox_fill_cpu(spec, 7, philox_stream_id("b"), 0, n, b.data());
  philox_fill_cpu(spec, 8, philox_stream_id("a"), 0, n, c.data());
  int same_ab = 0, same_ac = 0;
  for (int64_t i = 0; i < n; ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
  EXPECT_NE(philox_stream_id("a"), philox_stream_id("b"));
  static_assert(philox_stream_id("") == 0xcbf29ce484222325ull);   // FNV-1a offset basis
  static_assert(philox_stream_id("a") == 0xaf63dc4c8601ec8cull);  // published FNV-1a 64 of "a"
}

// Sample moments of 1e6 draws within 4 standard errors of the distribution's.
TEST(Philox, Moments) {
  const int64_t n = 1'000'000;
  std::vector<float> v(n);
  auto moments = [&](double& mean, double& var) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    mean = s / n;
    for (float x : v) s2 += (x - mean) * (x - mean);
    var = s2 / (n - 1);
  };
  double mean, var;

  const double mu = 0.5, sigma = 0.02;
  philox_fill_cpu(FillSpec::normal(mu, sigma), 42, 9, 0, n, v.data());
  moments(mean, var);
  EXPECT_NEAR(mean, mu, 4 * sigma / std::sqrt(n));
  // Var of the sample variance of a normal: 2 sigma^4 / (n - 1).
  EXPECT_NEAR(var, sigma * sigma, 4 * std::sqrt(2.0 / (n - 1)) * sigma * sigma);
  int64_t beyond3 = 0;
  for (float x : v) beyond3 += std::fabs(x - mu) > 3 * sigma;
  // P(|z| > 3) = 0.0027: expect 2700 +- 4 * sqrt(2700 * (1 - 0.0027)).
  EXPECT_NEAR(static_cast<double>(beyond3), 2699.8, 4 * std::sqrt(2699.8 * 0.9973));

  const double a = -1.0, b = 3.0;
  philox_fill_cpu(FillSpec::uniform(a, b), 42, 10, 0, n, v.data());
  for (float x : v) ASSERT_TRUE(x >= a && x < b) << x;
  moments(mean, var);
  const double uvar = (b - a) * (b - a) / 12.0;
  EXPECT_NEAR(mean, (a + b) / 2, 4 * std::sqrt(uvar / n));
  // Var of the sample variance of a uniform: (mu4 - sigma^4) / n, mu4 = (b - a)^4 / 80.
  EXPECT_NEAR(var, uvar, 4 * std::sqrt((std::pow(b - a, 4) / 80.0 - uvar * uvar) / n));
}

TEST(Philox, RejectsBadRange) {
  float out[4];
  EXPECT_THROW(philox_fill_cpu(FillSpec{}, 0, 0, 5, 4, out), InvalidArgument);
  EXPECT_THROW(philox_fill_cpu(FillSpec{}, 0, 0, -1, 4, out), InvalidArgument);
  EXPECT_NO_THROW(philox_fill_cpu(FillSpec{}, 0, 0, 4, 4, nullptr));
}

}  // namespace
}  // namespace zero3

// Gradient helpers: exact norms on crafted data, chunk-order determinism, Inf/NaN detection, scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "optim/grad_norm.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

TEST(GradNorm, ExactOnIntegers) {
  const int64_t n = 100003;  // 7 * 14286 + 1, spans several chunks
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  // Each period of 7 contributes 9 + 4 + 1 + 0 + 1 + 4 + 9 = 28; the last element is -3.
  EXPECT_EQ(squared_l2_norm(x.data(), n), 14286.0 * 28.0 + 9.0);
  EXPECT_EQ(squared_l2_norm(x.data(), 0), 0.0);
  EXPECT_THROW(squared_l2_norm(x.data(), -1), InvalidArgument);
}

TEST(GradNorm, FixedChunkOrder) {
  const int64_t n = 5 * kNormChunk + 123;
  std::vector<float> x(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  for (auto& v : x) v = dist(rng);
  // The documented order: double sums over fixed chunks, then the chunk sums in order.
  double expected = 0.0;
  for (int64_t lo = 0; lo < n; lo += kNormChunk) {
    double chunk = 0.0;
    for (int64_t i = lo; i < std::min(n, lo + kNormChunk); ++i) chunk += static_cast<double>(x[i]) * x[i];
    expected += chunk;
  }
  EXPECT_EQ(squared_l2_norm(x.data(), n), expected);
}

TEST(GradNorm, NonFinite) {
  const int64_t n = 3 * kNormChunk + 5;
  std::vector<float> x(n, 1.0f);
  EXPECT_FALSE(has_non_finite(x.data(), n));
  x[n - 1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(has_non_finite(x.data(), n));
  EXPECT_FALSE(has_non_finite(x.data(), n - 1));
  x[n - 1] = 1.0f;
  x[kNormChunk + 17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(has_non_finite(x.data(), n));
  x[kNormChunk + 17] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(has_non_finite(x.data(), n));
  EXPECT_TRUE(std::isinf(squared_l2_norm(x.data(), n)));
  EXPECT_FALSE(is_non_finite(std::numeric_limits<float>::max()));
  EXPECT_FALSE(is_non_finite(std::numeric_limits<float>::denorm_min()));
}

TEST(GradNorm, ScaleInPlace) {
  const int64_t n = 2 * kNormChunk + 3;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  scale_in_place(x.data(), n, 0.5f);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], static_cast<float>(i) * 0.5f);
}

TEST(GradNorm, ClipCoefficient) {
  EXPECT_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(10.0, 0.0), 1.0);  // clipping off
}

}  // namespace
}  // namespace zero3

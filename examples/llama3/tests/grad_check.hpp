// Helpers for the Llama-3 tests: deterministic random fills and central finite differences in double.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace llama3::testing {

template <typename T>
std::vector<T> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares analytic[i] with (loss(x + h e_i) - loss(x - h e_i)) / 2h for every `stride`-th element of x
// (x is restored afterwards). The tolerance is relative to the largest analytic gradient of the tensor:
// |fd - analytic| <= rtol * max(max|analytic|, floor).
inline void expect_gradient(std::vector<double>& x, const std::vector<double>& analytic,
                            const std::function<double()>& loss, const std::string& what, double rtol = 1e-6,
                            size_t stride = 1, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double scale = 1e-6;
  for (double g : analytic) scale = std::max(scale, std::fabs(g));
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const double orig = x[i];
    x[i] = orig + h;
    const double lp = loss();
    x[i] = orig - h;
    const double lm = loss();
    x[i] = orig;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::fabs(fd - analytic[i]);
    worst = std::max(worst, err / scale);
    if (err > rtol * scale && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: finite difference " << fd << ", backward " << analytic[i]
                    << " (tensor max |grad| " << scale << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": worst relative error " << worst;
}

// max |a - b| / max(max|b|, floor)
template <typename A, typename B>
double max_rel_diff(const A* a, const B* b, size_t n, double floor = 1e-30) {
  double scale = floor, err = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return err / scale;
}

}  // namespace llama3::testing

#include "optim/grad_norm.hpp"

#include <vector>

#include "core/check.hpp"
#include "zero3/error.hpp"

namespace zero3 {

double squared_l2_norm(const float* x, int64_t n) {
  ZERO3_REQUIRE(n >= 0, InvalidArgument, "squared_l2_norm: negative length ", n);
  if (n == 0) return 0.0;
  int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t lo = c * kNormChunk;
    int64_t hi = lo + kNormChunk < n ? lo + kNormChunk : n;
    double sum = 0.0;
    for (int64_t i = lo; i < hi; ++i) sum += squared(x[i]);
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

bool has_non_finite(const float* x, int64_t n) {
  ZERO3_REQUIRE(n >= 0, InvalidArgument, "has_non_finite: negative length ", n);
  bool found = false;
#pragma omp parallel for schedule(static) reduction(|| : found) if (n > kNormChunk)
  for (int64_t i = 0; i < n; ++i) found = found || is_non_finite(x[i]);
  return found;
}

void scale_in_place(float* x, int64_t n, float factor) {
  ZERO3_REQUIRE(n >= 0, InvalidArgument, "scale_in_place: negative length ", n);
#pragma omp parallel for schedule(static) if (n > kNormChunk)
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace zero3

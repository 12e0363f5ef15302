// Rows of logits at a real vocabulary size, of the kinds a language model produces, and their cross-entropy in
// double with compensated summation: the reference the accuracy tests of the CPU op (test_ops.cpp) and the CUDA
// kernel (gpu/test_cuda_ops.cpp) compare with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/cross_entropy.hpp"

namespace llama3::testing {

inline constexpr int64_t kLlama3Vocab = 128256;

struct CrossEntropyRows {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;     // (rows, vocab)
  std::vector<int32_t> targets;  // (rows)
  std::vector<std::string> kinds;
};

// Six rows: a trained model's confident row (the target 2 above the largest of N(0, 2.5^2) logits), its unsure
// row (the target the 5th largest), a near-uniform row (N(0, 0.05^2)), a certain row (the target 25 above the
// rest: loss about 3e-6, p - 1 about -3e-6), a wrong row (the target the smallest logit) and an ignored row.
inline CrossEntropyRows llm_like_rows(int64_t vocab, uint64_t seed) {
  CrossEntropyRows c;
  c.vocab = vocab;
  c.kinds = {"confident", "unsure", "near-uniform", "certain", "wrong", "ignored"};
  c.rows = static_cast<int64_t>(c.kinds.size());
  c.logits.resize(static_cast<size_t>(c.rows * vocab));
  std::mt19937_64 rng(seed);
  for (int64_t r = 0; r < c.rows; ++r) {
    float* x = c.logits.data() + r * vocab;
    const double sd = c.kinds[r] == "near-uniform" ? 0.05 : c.kinds[r] == "certain" ? 1.0 : 2.5;
    std::normal_distribution<double> dist(0.0, sd);
    for (int64_t j = 0; j < vocab; ++j) x[j] = static_cast<float>(dist(rng));
    const int32_t t = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
    const float mx = *std::max_element(x, x + vocab);
    if (c.kinds[r] == "confident") x[t] = mx + 2.0f;
    if (c.kinds[r] == "certain") x[t] = mx + 25.0f;
    if (c.kinds[r] == "unsure") {
      std::vector<float> sorted(x, x + vocab);
      std::nth_element(sorted.begin(), sorted.begin() + 4, sorted.end(), std::greater<float>());
      x[t] = sorted[4];
    }
    if (c.kinds[r] == "wrong") x[t] = *std::min_element(x, x + vocab) - 1.0f;
    c.targets.push_back(c.kinds[r] == "ignored" ? kIgnoreIndex : t);
  }
  return c;
}

// Loss of each row and grad_scale * (softmax - onehot), in double, the sums of exponentials compensated
// (Neumaier), so both are exact to about 1e-15 relative.
struct CrossEntropyReference {
  std::vector<double> loss;  // (rows)
  std::vector<double> grad;  // (rows, vocab)
};

inline CrossEntropyReference cross_entropy_reference(const CrossEntropyRows& c, double grad_scale) {
  CrossEntropyReference ref;
  ref.loss.assign(static_cast<size_t>(c.rows), 0.0);
  ref.grad.assign(c.logits.size(), 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.targets[r] == kIgnoreIndex) continue;
    const float* x = c.logits.data() + r * c.vocab;
    const double mx = *std::max_element(x, x + c.vocab);
    double sum = 0, comp = 0;
    for (int64_t j = 0; j < c.vocab; ++j) {
      const double term = std::exp(static_cast<double>(x[j]) - mx), t = sum + term;
      comp += std::fabs(sum) >= std::fabs(term) ? (sum - t) + term : (term - t) + sum;
      sum = t;
    }
    sum += comp;
    // log-sum-exp = mx + log_sum, kept apart so that a loss far below mx keeps its digits.
    const double log_sum = std::log(sum), dt = static_cast<double>(x[c.targets[r]]) - mx;
    ref.loss[r] = log_sum - dt;
    for (int64_t j = 0; j < c.vocab; ++j) {
      ref.grad[r * c.vocab + j] = std::exp((static_cast<double>(x[j]) - mx) - log_sum) * grad_scale;
    }
    ref.grad[r * c.vocab + c.targets[r]] = std::expm1(dt - log_sum) * grad_scale;
  }
  return ref;
}

// The largest |got - want| / |want| over a row's elements, counting as exact any element whose reference is
// below float's smallest normal number (float stores those with an absolute error of at most 2^-150).
template <typename T>
double max_elementwise_rel(const T* got, const double* want, int64_t n) {
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double err = std::fabs(static_cast<double>(got[j]) - want[j]);
    if (std::fabs(want[j]) < 1.1754944e-38) {
      if (err > 1e-44) return INFINITY;
      continue;
    }
    worst = std::max(worst, err / std::fabs(want[j]));
  }
  return worst;
}

}  // namespace llama3::testing

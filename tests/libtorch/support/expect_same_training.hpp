// The comparison the libtorch tests share: a run's per-step losses and gradient norms against a reference's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "support/libtorch_training.hpp"

namespace zero3::testing {

// Every step's loss and gradient norm of `got` within `tolerance` (relative) of `want`'s, the step named.
inline void expect_same_steps(const TrainRun& got, const TrainRun& want, double tolerance = 1e-5) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  ASSERT_EQ(got.grad_norms.size(), want.grad_norms.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], tolerance * std::fabs(want.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], want.grad_norms[s], tolerance * want.grad_norms[s]) << "step " << s;
  }
}

}  // namespace zero3::testing

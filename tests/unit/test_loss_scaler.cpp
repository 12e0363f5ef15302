// The loss scaler through overflow sequences whose outcome follows from DeepSpeed's DynamicLossScaler by hand.
#include <gtest/gtest.h>

#include "optim/loss_scaler.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

Fp16Config dynamic_fp16(int64_t power, int64_t window, int64_t hysteresis, double min_scale = 1.0,
                        bool consecutive = false) {
  Fp16Config f;
  f.enabled = true;
  f.loss_scale = 0;
  f.initial_scale_power = power;
  f.loss_scale_window = window;
  f.hysteresis = hysteresis;
  f.min_loss_scale = min_scale;
  f.consecutive_hysteresis = consecutive;
  return f;
}

TEST(LossScaler, DisabledIsStaticOne) {
  LossScaler s{Fp16Config{}};
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // an overflow still skips the step
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StaticScale) {
  Fp16Config f;
  f.enabled = true;
  f.loss_scale = 128;
  LossScaler s(f);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, HysteresisThenWindow) {
  LossScaler s(dynamic_fp16(/*power=*/4, /*window=*/3, /*hysteresis=*/2));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_FALSE(s.update(true));  // iter 0: hysteresis absorbs it (2 -> 1)
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  EXPECT_FALSE(s.update(true));  // iter 1: no hysteresis left: halve
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_EQ(s.state().last_overflow_iter, 1);
  // Good steps at iters 2, 3, 4, 5: stable intervals 0, 1, 2, 3; the scale doubles at 3.
  const double after[] = {8, 8, 8, 16};
  for (double expected : after) {
    EXPECT_TRUE(s.update(false));
    EXPECT_EQ(s.scale(), expected);
  }
  EXPECT_EQ(s.state().cur_hysteresis, 2);  // refilled by the increase
  // Then every 3 good steps (stable 6, 9).
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 32.0);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 64.0);
  EXPECT_EQ(s.state().cur_iter, 12);
}

TEST(LossScaler, FromTheStartNeedsWindowPlusOneGoodSteps) {
  LossScaler s(dynamic_fp16(16, 1000, 2));
  EXPECT_EQ(s.scale(), 65536.0);
  for (int i = 0; i < 1000; ++i) s.update(false);  // iters 0..999: stable 0..999
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);  // iter 1000: stable 1000
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScaler, HysteresisOneHalvesEveryOverflow) {
  LossScaler s(dynamic_fp16(10, 100, 1));
  s.update(true);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, NonConsecutiveHysteresisIsNotRefilledByAGoodStep) {
  LossScaler s(dynamic_fp16(8, 100, 2));
  s.update(true);   // 2 -> 1
  s.update(false);  // not refilled
  s.update(true);   // halve
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  LossScaler s(dynamic_fp16(8, 100, 2, 1.0, /*consecutive=*/true));
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(s.update(true));  // absorbed
    EXPECT_TRUE(s.update(false));  // refilled
  }
  EXPECT_EQ(s.scale(), 256.0);
  s.update(true);
  s.update(true);  // two in a row exhaust it
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, MinimumClampAndError) {
  LossScaler s(dynamic_fp16(3, 100, 1, /*min=*/3.0));
  s.update(true);  // 8 -> 4
  EXPECT_EQ(s.scale(), 4.0);
  s.update(true);  // max(2, 3) = 3
  EXPECT_EQ(s.scale(), 3.0);
  EXPECT_THROW(s.update(true), Error);  // already at the minimum: DeepSpeed raises too
}

TEST(LossScaler, MinimumWithHysteresisLeftIsNoError) {
  LossScaler s(dynamic_fp16(0, 100, 2, /*min=*/1.0));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(true));  // hysteresis absorbs it
  EXPECT_THROW(s.update(true), Error);
}

TEST(LossScaler, SaveAndRestore) {
  LossScaler a(dynamic_fp16(6, 4, 3));
  const bool seq1[] = {true, false, true, true, false, false};
  for (bool o : seq1) a.update(o);
  LossScalerState saved = a.state();
  LossScaler b(dynamic_fp16(6, 4, 3));
  b.restore(saved);
  const bool seq2[] = {false, false, false, true, true, true, false, false, false, false, false};
  for (bool o : seq2) {
    EXPECT_EQ(a.update(o), b.update(o));
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.state().cur_hysteresis, b.state().cur_hysteresis);
  }
  LossScalerState bad = saved;
  bad.cur_scale = 0.0;
  EXPECT_THROW(b.restore(bad), InvalidArgument);
}

TEST(LossScaler, RejectsBadConfig) {
  EXPECT_THROW(LossScaler(dynamic_fp16(16, 0, 2)), ConfigError);
  EXPECT_THROW(LossScaler(dynamic_fp16(16, 1000, 0)), ConfigError);
  EXPECT_THROW(LossScaler(dynamic_fp16(16, 1000, 2, 0.0)), ConfigError);
  Fp16Config f = dynamic_fp16(16, 1000, 2);
  f.loss_scale = -1;
  EXPECT_THROW(LossScaler{f}, ConfigError);
}

}  // namespace
}  // namespace zero3

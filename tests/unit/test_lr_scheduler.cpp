// The schedules against values worked out by hand from DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py),
// at the iteration counter DeepSpeed uses (last_batch_iteration: -1 before the first scheduler step).
#include <gtest/gtest.h>

#include <cmath>

#include "optim/lr_scheduler.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

constexpr double kTol = 1e-15;

Config warmup_config(SchedulerType type, const std::string& warmup_type) {
  Config c;
  c.optimizer.lr = 0.01;
  c.scheduler.type = type;
  c.scheduler.warmup_min_lr = 0.0;
  c.scheduler.warmup_max_lr = 0.01;
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = warmup_type;
  return c;
}

TEST(LrScheduler, NoneIsTheOptimizerLr) {
  Config c;
  c.optimizer.lr = 3e-4;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->name(), "none");
  for (int64_t it : {-1, 0, 1, 1000}) EXPECT_EQ(s->lr_at(it), 3e-4);
  EXPECT_FALSE(s->beta1_at(0).has_value());
  c.optimizer.lr.reset();  // "auto", unresolved
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
}

TEST(LrScheduler, WarmupLrLog) {
  auto s = make_lr_scheduler(warmup_config(SchedulerType::warmup_lr, "log"));
  EXPECT_EQ(s->name(), "WarmupLR");
  EXPECT_EQ(s->lr_at(-1), 0.0);  // construction lr: warmup_min_lr
  EXPECT_EQ(s->lr_at(0), 0.0);   // log(1) = 0: the first two optimizer steps both run at min_lr
  // 0.01 * log(5) / log(10)
  EXPECT_NEAR(s->lr_at(4), 0.006989700043360187, kTol);
  EXPECT_NEAR(s->lr_at(9), 0.01, kTol);  // log(10) / log(10)
  EXPECT_EQ(s->lr_at(10), 0.01);
  EXPECT_EQ(s->lr_at(100000), 0.01);
}

TEST(LrScheduler, WarmupLrLinearWithMinLr) {
  Config c = warmup_config(SchedulerType::warmup_lr, "linear");
  c.scheduler.warmup_min_lr = 0.002;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->lr_at(-1), 0.002);
  EXPECT_NEAR(s->lr_at(0), 0.002, kTol);
  EXPECT_NEAR(s->lr_at(4), 0.002 + 0.008 * 0.4, kTol);
  EXPECT_NEAR(s->lr_at(9), 0.002 + 0.008 * 0.9, kTol);  // linear warmup never reaches max inside the warmup
  EXPECT_EQ(s->lr_at(10), 0.01);
}

TEST(LrScheduler, WarmupLrTakesOptimizerLrWhenMaxUnset) {
  Config c = warmup_config(SchedulerType::warmup_lr, "linear");
  c.scheduler.warmup_max_lr.reset();
  c.optimizer.lr = 0.05;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->lr_at(50), 0.05);
}

TEST(LrScheduler, WarmupStepsRaisedToTwo) {
  Config c = warmup_config(SchedulerType::warmup_lr, "log");
  c.scheduler.warmup_num_steps = 1;  // DeepSpeed uses max(2, warmup_num_steps)
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->lr_at(0), 0.0);
  EXPECT_NEAR(s->lr_at(1), 0.01, kTol);
  c.scheduler.warmup_num_steps = 0;
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = "cosine";
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
}

TEST(LrScheduler, WarmupDecayLr) {
  Config c = warmup_config(SchedulerType::warmup_decay_lr, "linear");
  c.scheduler.total_num_steps = 110;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->name(), "WarmupDecayLR");
  EXPECT_NEAR(s->lr_at(5), 0.005, kTol);
  EXPECT_EQ(s->lr_at(10), 0.01);           // (110 - 10) / (110 - 10)
  EXPECT_NEAR(s->lr_at(60), 0.005, kTol);  // (110 - 60) / 100
  EXPECT_NEAR(s->lr_at(109), 0.0001, kTol);
  EXPECT_EQ(s->lr_at(110), 0.0);
  EXPECT_EQ(s->lr_at(500), 0.0);  // clamped at 0
  c.scheduler.total_num_steps.reset();
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
}

TEST(LrScheduler, WarmupCosineLr) {
  Config c = warmup_config(SchedulerType::warmup_cosine_lr, "linear");
  c.scheduler.total_num_steps = 110;
  c.scheduler.warmup_min_ratio = 0.1;
  c.scheduler.cos_min_ratio = 0.0001;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->name(), "WarmupCosineLR");
  EXPECT_EQ(s->lr_at(-1), 0.0);            // DeepSpeed's lr before the first step
  EXPECT_NEAR(s->lr_at(0), 0.001, kTol);   // 0.01 * warmup_min_ratio
  EXPECT_NEAR(s->lr_at(5), 0.0055, kTol);  // 0.01 * (0.1 + 0.5 * 0.9)
  EXPECT_NEAR(s->lr_at(9), 0.0091, kTol);
  // it 10: progress 1/100: 0.01 * (0.0001 + 0.9999 * (1 + cos(0.01 pi)) / 2)
  EXPECT_NEAR(s->lr_at(10), 0.009997533048548475, kTol);
  EXPECT_NEAR(s->lr_at(59), 0.0050005, kTol);  // progress 1/2
  EXPECT_NEAR(s->lr_at(109), 1e-6, kTol);      // progress 1: cos_min_ratio
  EXPECT_NEAR(s->lr_at(1000), 1e-6, kTol);     // stays at the floor
  c.optimizer.lr.reset();
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
}

Config one_cycle_config() {
  Config c;
  c.scheduler.type = SchedulerType::one_cycle;
  c.scheduler.cycle_min_lr = 0.001;
  c.scheduler.cycle_max_lr = 0.01;
  c.scheduler.cycle_first_step_size = 10;
  c.scheduler.cycle_second_step_size = 10;
  c.scheduler.cycle_momentum = true;
  c.scheduler.cycle_min_mom = 0.8;
  c.scheduler.cycle_max_mom = 0.9;
  return c;
}

TEST(LrScheduler, OneCycleTriangle) {
  auto s = make_lr_scheduler(one_cycle_config());
  EXPECT_EQ(s->name(), "OneCycle");
  EXPECT_NEAR(s->lr_at(-1), 0.001, kTol);   // batch 0: bottom of the cycle
  EXPECT_NEAR(s->lr_at(4), 0.0055, kTol);   // batch 5: halfway up
  EXPECT_NEAR(s->lr_at(9), 0.01, kTol);     // batch 10: the peak
  EXPECT_NEAR(s->lr_at(14), 0.0055, kTol);  // batch 15: halfway down
  EXPECT_NEAR(s->lr_at(18), 0.0019, kTol);  // batch 19: scale 0.1
  EXPECT_EQ(s->lr_at(19), 0.001);           // cycle over, no decay configured
  EXPECT_EQ(s->lr_at(1000), 0.001);
}

TEST(LrScheduler, OneCycleMomentum) {
  auto s = make_lr_scheduler(one_cycle_config());
  // DeepSpeed sets cycle_min_mom at construction, so the first optimizer step uses it.
  EXPECT_EQ(*s->beta1_at(-1), 0.8);
  EXPECT_NEAR(*s->beta1_at(4), 0.85, kTol);
  EXPECT_NEAR(*s->beta1_at(9), 0.8, kTol);
  EXPECT_NEAR(*s->beta1_at(14), 0.85, kTol);
  EXPECT_EQ(*s->beta1_at(19), 0.9);
  EXPECT_EQ(*s->beta2_at(4), 0.99);  // DeepSpeed's OneCycle replaces beta2 with 0.99
  Config c = one_cycle_config();
  c.scheduler.cycle_momentum = false;
  auto plain = make_lr_scheduler(c);
  EXPECT_FALSE(plain->beta1_at(4).has_value());
  EXPECT_FALSE(plain->beta2_at(4).has_value());
}

TEST(LrScheduler, OneCycleDecay) {
  Config c = one_cycle_config();
  c.scheduler.decay_lr_rate = 0.5;
  c.scheduler.decay_step_size = 2;
  c.scheduler.decay_mom_rate = 0.1;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->lr_at(19), 0.001);                 // batch 20 is still the cycle's last (bottom) point
  EXPECT_NEAR(s->lr_at(20), 0.001 / 1.25, kTol);  // decay iteration 1: interval 0.5
  EXPECT_NEAR(s->lr_at(23), 0.0005, kTol);        // decay iteration 4: interval 2
  EXPECT_NEAR(*s->beta1_at(23), 0.9 * 1.2, kTol);
  c.scheduler.decay_step_size = 0;  // no decay when the step size is 0
  EXPECT_EQ(make_lr_scheduler(c)->lr_at(23), 0.001);
}

TEST(LrScheduler, OneCycleStairs) {
  Config c = one_cycle_config();
  c.scheduler.cycle_first_stair_count = 2;
  c.scheduler.cycle_second_stair_count = 2;
  auto s = make_lr_scheduler(c);
  EXPECT_EQ(s->lr_at(2), 0.001);            // batch 3: stair 0
  EXPECT_NEAR(s->lr_at(4), 0.0055, kTol);   // batch 5: stair 1 of 2
  EXPECT_NEAR(s->lr_at(8), 0.0055, kTol);   // batch 9: still stair 1
  EXPECT_NEAR(s->lr_at(9), 0.01, kTol);     // batch 10: the peak
  EXPECT_NEAR(s->lr_at(14), 0.0055, kTol);  // batch 15: (20 - 15) * 2 / 10 = 1
  EXPECT_EQ(s->lr_at(16), 0.001);           // batch 17: 0.6 -> stair 0
}

TEST(LrScheduler, OneCycleAsymmetric) {
  Config c = one_cycle_config();
  c.scheduler.cycle_second_step_size = 30;  // step ratio 1/4
  auto s = make_lr_scheduler(c);
  EXPECT_NEAR(s->lr_at(9), 0.01, kTol);
  // batch 20: x = 0.5, scale (0.5 - 1) / (0.25 - 1) = 2/3
  EXPECT_NEAR(s->lr_at(19), 0.001 + 0.009 * (2.0 / 3.0), kTol);
  EXPECT_EQ(s->lr_at(39), 0.001);
  c.scheduler.cycle_second_step_size.reset();  // defaults to the first
  EXPECT_NEAR(make_lr_scheduler(c)->lr_at(14), 0.0055, kTol);
  c.scheduler.cycle_first_step_size = 0;
  EXPECT_THROW(make_lr_scheduler(c), ConfigError);
}

// DeepSpeed's engine advances the schedule only after applied steps: a skipped step reuses the lr.
TEST(LrScheduler, SkippedStepsDoNotAdvance) {
  auto s = make_lr_scheduler(warmup_config(SchedulerType::warmup_lr, "linear"));
  const bool applied[] = {true, false, true, true, false, true};
  const double expected[] = {0.0, 0.0, 0.0, 0.001, 0.002, 0.002};
  int64_t it = -1;
  for (int step = 0; step < 6; ++step) {
    EXPECT_NEAR(s->lr_at(it), expected[step], kTol) << "step " << step;
    if (applied[step]) ++it;
  }
}

}  // namespace
}  // namespace zero3

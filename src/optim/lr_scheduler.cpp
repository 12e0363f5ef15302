#include "optim/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.hpp"
#include "zero3/error.hpp"

namespace zero3 {
namespace {

constexpr const char* kParams = "scheduler.params.";

double require_lr(const Config& config, const char* why) {
  ZERO3_REQUIRE(config.optimizer.lr.has_value(), ConfigError, "optimizer.params.lr: is still \"auto\"; ", why,
                " needs a value (pass the learning rate to resolve())");
  return *config.optimizer.lr;
}

class ConstantLr final : public LrScheduler {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lr_at(int64_t) const override { return lr_; }
  std::string name() const override { return "none"; }

 private:
  double lr_;
};

// The warmup shared by WarmupLR, WarmupDecayLR and WarmupCosineLR: DeepSpeed raises warmup_num_steps to
// at least 2 (log(1) = 0 would divide by zero) and precomputes 1 / log(warmup_num_steps).
struct Warmup {
  int64_t num_steps = 2;
  bool log_type = true;
  double inverse_log = 0;

  Warmup(const SchedulerConfig& s, const char* type) {
    ZERO3_REQUIRE(s.warmup_num_steps.has_value(), ConfigError, kParams, "warmup_num_steps: is still \"auto\"; ", type,
                  " needs a value (pass the warmup steps to resolve())");
    ZERO3_REQUIRE(*s.warmup_num_steps > 0, ConfigError, kParams, "warmup_num_steps: ", *s.warmup_num_steps,
                  " is not a positive integer");
    ZERO3_REQUIRE(s.warmup_type == "log" || s.warmup_type == "linear", ConfigError, kParams, "warmup_type: \"",
                  s.warmup_type, "\" is neither \"log\" nor \"linear\"");
    num_steps = std::max<int64_t>(2, *s.warmup_num_steps);
    log_type = s.warmup_type == "log";
    inverse_log = 1.0 / std::log(static_cast<double>(num_steps));
  }

  // The warmup fraction at iteration `it` (0 <= it < num_steps).
  double gamma(int64_t it) const {
    if (log_type) return inverse_log * std::log(static_cast<double>(it + 1));
    return static_cast<double>(it) / static_cast<double>(num_steps);
  }
};

int64_t require_total(const SchedulerConfig& s, const char* type) {
  ZERO3_REQUIRE(s.total_num_steps.has_value(), ConfigError, kParams, "total_num_steps: missing or still \"auto\"; ",
                type, " needs the total number of training steps (pass total_steps to resolve())");
  ZERO3_REQUIRE(*s.total_num_steps > 0, ConfigError, kParams, "total_num_steps: ", *s.total_num_steps,
                " is not a positive integer");
  return *s.total_num_steps;
}

// WarmupLR, and WarmupDecayLR when total_steps is set: lr = min + (max - min) * gamma.
class WarmupLr final : public LrScheduler {
 public:
  WarmupLr(const SchedulerConfig& s, double max_lr, std::optional<int64_t> total_steps)
      : warmup_(s, total_steps ? "WarmupDecayLR" : "WarmupLR"),
        min_lr_(s.warmup_min_lr),
        delta_lr_(max_lr - s.warmup_min_lr),
        total_steps_(total_steps) {}

  double lr_at(int64_t it) const override {
    if (it < 0) return min_lr_;  // the lr set at construction
    return min_lr_ + delta_lr_ * gamma(it);
  }
  std::string name() const override { return total_steps_ ? "WarmupDecayLR" : "WarmupLR"; }

 private:
  double gamma(int64_t it) const {
    if (it < warmup_.num_steps) return warmup_.gamma(it);
    if (!total_steps_) return 1.0;
    double remaining = static_cast<double>(*total_steps_ - it);
    double span = std::max(1.0, static_cast<double>(*total_steps_ - warmup_.num_steps));
    return std::max(0.0, remaining / span);
  }

  Warmup warmup_;
  double min_lr_;
  double delta_lr_;
  std::optional<int64_t> total_steps_;
};

// WarmupCosineLR: lr = optimizer lr * ratio; the ratio warms up from warmup_min_ratio to 1, then follows a
// half cosine down to cos_min_ratio and stays there.
class WarmupCosineLr final : public LrScheduler {
 public:
  WarmupCosineLr(const SchedulerConfig& s, double base_lr)
      : warmup_(s, "WarmupCosineLR"),
        base_lr_(base_lr),
        total_steps_(require_total(s, "WarmupCosineLR")),
        warmup_min_ratio_(s.warmup_min_ratio),
        cos_min_ratio_(s.cos_min_ratio) {}

  double lr_at(int64_t it) const override {
    if (it < 0) return 0.0;  // DeepSpeed's lr before the first scheduler step
    return base_lr_ * ratio(it);
  }
  std::string name() const override { return "WarmupCosineLR"; }

 private:
  double ratio(int64_t it) const {
    if (it < warmup_.num_steps) {
      double r = warmup_.gamma(it);
      return warmup_min_ratio_ + r * (1.0 - warmup_min_ratio_);
    }
    double real_last = static_cast<double>(it - warmup_.num_steps + 1);
    double real_total = static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_.num_steps));
    double progress = std::min(1.0, real_last / real_total);
    double r = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * r);
  }

  Warmup warmup_;
  double base_lr_;
  int64_t total_steps_;
  double warmup_min_ratio_;
  double cos_min_ratio_;
};

// OneCycle: one triangular cycle of lr (min -> max -> min) and, inversely, momentum; then an optional
// inverse-time decay of lr (and growth of momentum) every decay_step_size iterations.
class OneCycleLr final : public LrScheduler {
 public:
  explicit OneCycleLr(const SchedulerConfig& s)
      : min_lr_(s.cycle_min_lr),
        max_lr_(s.cycle_max_lr),
        decay_lr_rate_(s.decay_lr_rate),
        first_(static_cast<double>(s.cycle_first_step_size)),
        second_(static_cast<double>(s.cycle_second_step_size.value_or(s.cycle_first_step_size))),
        first_stairs_(s.cycle_first_stair_count),
        second_stairs_(s.cycle_second_stair_count),
        decay_step_size_(static_cast<double>(s.decay_step_size)),
        cycle_momentum_(s.cycle_momentum),
        min_mom_(s.cycle_min_mom),
        max_mom_(s.cycle_max_mom),
        decay_mom_rate_(s.decay_mom_rate) {
    ZERO3_REQUIRE(s.cycle_first_step_size > 0, ConfigError, kParams, "cycle_first_step_size: ", s.cycle_first_step_size,
                  " is not a positive integer");
    ZERO3_REQUIRE(second_ >= 0, ConfigError, kParams, "cycle_second_step_size: ", second_, " is negative");
    ZERO3_REQUIRE(first_stairs_ >= 0 && second_stairs_ >= 0, ConfigError, kParams,
                  "cycle_first_stair_count / cycle_second_stair_count: negative (", first_stairs_, ", ", second_stairs_,
                  ")");
    ZERO3_REQUIRE(s.decay_step_size >= 0, ConfigError, kParams, "decay_step_size: ", s.decay_step_size, " is negative");
    total_ = first_ + second_;
    step_ratio_ = first_ / total_;
    // DeepSpeed skips a decay when its step size or its rate is zero.
    skip_lr_decay_ = decay_step_size_ == 0.0 || decay_lr_rate_ == 0.0;
    skip_mom_decay_ = decay_step_size_ == 0.0 || decay_mom_rate_ == 0.0;
  }

  double lr_at(int64_t it) const override {
    if (static_cast<double>(it) < total_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor(it);
    if (skip_lr_decay_) return min_lr_;
    double interval = static_cast<double>(it - static_cast<int64_t>(total_) + 1) / decay_step_size_;
    return min_lr_ / (1.0 + decay_lr_rate_ * interval);
  }

  std::optional<double> beta1_at(int64_t it) const override {
    if (!cycle_momentum_) return std::nullopt;
    // At construction DeepSpeed sets the momentum to cycle_min_mom, while its formula at iteration -1
    // gives cycle_max_mom; the first optimizer step runs with the construction value.
    if (it < 0) return min_mom_;
    if (static_cast<double>(it) < total_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor(it);
    if (skip_mom_decay_) return max_mom_;
    double interval = static_cast<double>(it - static_cast<int64_t>(total_) + 1) / decay_step_size_;
    return max_mom_ * (1.0 + decay_mom_rate_ * interval);
  }

  std::optional<double> beta2_at(int64_t) const override {
    if (!cycle_momentum_) return std::nullopt;
    return 0.99;
  }

  std::string name() const override { return "OneCycle"; }

 private:
  // Where iteration `it` sits in the cycle: 0 at the ends, 1 at the peak.
  double scale_factor(int64_t it) const {
    double batch = static_cast<double>(it + 1);
    double cycle = std::floor(1.0 + batch / total_);
    double x = 1.0 + batch / total_ - cycle;
    double factor;
    int64_t stairs;
    if (x <= step_ratio_) {
      factor = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      factor = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      // Quantised from the integer position in the cycle, not from `factor`, as DeepSpeed does.
      double in_cycle = std::fmod(batch, total_);
      double position = in_cycle <= first_ ? in_cycle * static_cast<double>(stairs) / first_
                                           : (total_ - in_cycle) * static_cast<double>(stairs) / second_;
      factor = std::floor(position) / static_cast<double>(stairs);
    }
    return factor;
  }

  double min_lr_, max_lr_, decay_lr_rate_;
  double first_, second_;
  int64_t first_stairs_, second_stairs_;
  double decay_step_size_;
  bool cycle_momentum_;
  double min_mom_, max_mom_, decay_mom_rate_;
  double total_ = 0, step_ratio_ = 0;
  bool skip_lr_decay_ = true, skip_mom_decay_ = true;
};

}  // namespace

std::unique_ptr<LrScheduler> make_lr_scheduler(const Config& config) {
  const SchedulerConfig& s = config.scheduler;
  switch (s.type) {
    case SchedulerType::none:
      return std::make_unique<ConstantLr>(require_lr(config, "a constant learning rate"));
    case SchedulerType::warmup_lr:
    case SchedulerType::warmup_decay_lr: {
      bool decay = s.type == SchedulerType::warmup_decay_lr;
      const char* type = decay ? "WarmupDecayLR" : "WarmupLR";
      // DeepSpeed's WarmupLR takes the optimizer's lr when warmup_max_lr is not given.
      double max_lr = s.warmup_max_lr ? *s.warmup_max_lr : require_lr(config, type);
      std::optional<int64_t> total;
      if (decay) total = require_total(s, type);
      return std::make_unique<WarmupLr>(s, max_lr, total);
    }
    case SchedulerType::warmup_cosine_lr:
      return std::make_unique<WarmupCosineLr>(s, require_lr(config, "WarmupCosineLR"));
    case SchedulerType::one_cycle:
      return std::make_unique<OneCycleLr>(s);
  }
  throw ConfigError("scheduler.type: unknown scheduler type");
}

}  // namespace zero3

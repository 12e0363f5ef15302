#include "optim/optimizer.hpp"

#include "core/check.hpp"
#include "zero3/error.hpp"

namespace zero3 {

AdamHyper adam_hyper_from_config(const Config& config) {
  const OptimizerConfig& o = config.optimizer;
  ZERO3_REQUIRE(
      o.lr.has_value(), ConfigError,
      "optimizer.params.lr: is still \"auto\"; pass the learning rate to resolve() before creating the Engine");
  ZERO3_REQUIRE(o.weight_decay.has_value(), ConfigError,
                "optimizer.params.weight_decay: is still \"auto\"; pass it to resolve() before creating the Engine");
  ZERO3_REQUIRE(*o.lr >= 0.0, ConfigError, "optimizer.params.lr: ", *o.lr, " is negative");
  ZERO3_REQUIRE(o.beta1 >= 0.0 && o.beta1 < 1.0, ConfigError, "optimizer.params.betas[0]: ", o.beta1,
                " is not in [0, 1)");
  ZERO3_REQUIRE(o.beta2 >= 0.0 && o.beta2 < 1.0, ConfigError, "optimizer.params.betas[1]: ", o.beta2,
                " is not in [0, 1)");
  ZERO3_REQUIRE(o.eps > 0.0, ConfigError, "optimizer.params.eps: ", o.eps, " is not positive");
  ZERO3_REQUIRE(*o.weight_decay >= 0.0, ConfigError, "optimizer.params.weight_decay: ", *o.weight_decay,
                " is negative");
  AdamHyper h;
  h.lr = static_cast<float>(*o.lr);
  h.beta1 = static_cast<float>(o.beta1);
  h.beta2 = static_cast<float>(o.beta2);
  h.eps = static_cast<float>(o.eps);
  h.weight_decay = static_cast<float>(*o.weight_decay);
  h.adam_w_mode = o.type == OptimizerType::adamw ? true : o.adam_w_mode;
  h.bias_correction = o.bias_correction;
  return h;
}

AdamHyper adam_hyper_at(const AdamHyper& base, const LrScheduler& schedule, int64_t it) {
  AdamHyper h = base;
  h.lr = static_cast<float>(schedule.lr_at(it));
  if (auto b1 = schedule.beta1_at(it)) h.beta1 = static_cast<float>(*b1);
  if (auto b2 = schedule.beta2_at(it)) h.beta2 = static_cast<float>(*b2);
  return h;
}

}  // namespace zero3

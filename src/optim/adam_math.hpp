// Adam and AdamW as DeepSpeed's Adam/AdamW define them, one element at a time. This is the reference
// every implementation is tested against (the SIMD CPU Adam, the CUDA kernel) and is itself the scalar
// path. Single-source: compiled for host and device.
//
//   adam_w_mode (AdamW): p <- p - lr*wd*p, then the Adam update on g.
//   otherwise (Adam, L2): g <- g + wd*p, then the Adam update.
//   m <- b1*m + (1-b1)*g;  v <- b2*v + (1-b2)*g*g
//   p <- p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),   bc_i = 1 - b_i^step (1 without bias correction)
//
// The operations are written one per statement, in this order, with no fused multiply-add, so that a
// vector implementation doing the same operations in the same order produces the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "zero3/host_device.hpp"

namespace zero3 {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adam_w_mode = true;
  bool bias_correction = true;
};

// Per-step constants, computed once on the host from the hyper-parameters and the step number (1-based).
struct AdamStepConsts {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;          // -lr / bc1
  float inv_sqrt_bc2;       // 1 / sqrt(bc2)
  float decoupled_decay;    // 1 - lr*wd for AdamW, 1 otherwise
  float l2_decay;           // wd for Adam (L2), 0 otherwise
};

inline AdamStepConsts adam_step_consts(const AdamHyper& h, int64_t step) {
  double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step)) : 1.0;
  double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step)) : 1.0;
  AdamStepConsts c;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  c.step_size = static_cast<float>(-static_cast<double>(h.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decoupled_decay = h.adam_w_mode ? 1.0f - h.lr * h.weight_decay : 1.0f;
  c.l2_decay = h.adam_w_mode ? 0.0f : h.weight_decay;
  return c;
}

// One element. p, m, v are fp32 master weight and moments; g is the (unscaled, clipped) fp32 gradient.
ZERO3_HOST_DEVICE void adam_update(float& p, float g, float& m, float& v, const AdamStepConsts& c) {
  float gp = c.l2_decay * p;
  g = g + gp;
  float mb = c.beta1 * m;
  float ga = c.one_minus_beta1 * g;
  m = mb + ga;
  float vb = c.beta2 * v;
  float gg = g * g;
  float gb = c.one_minus_beta2 * gg;
  v = vb + gb;
  float s = sqrtf(v);
  float sc = s * c.inv_sqrt_bc2;
  float denom = sc + c.eps;
  float pd = p * c.decoupled_decay;
  float upd = m / denom;
  float delta = c.step_size * upd;
  p = pd + delta;
}

}  // namespace zero3

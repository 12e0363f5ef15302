#include "support/reference_model.hpp"

#include <cmath>
#include <stdexcept>

#include "kernels/philox_init.hpp"
#include "zero/param_fill.hpp"
#include "zero3/dtype.hpp"

namespace zero3::testing {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from (seed, a, b).
float data_value(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h = splitmix64(seed ^ splitmix64(a * 0x100000001b3ull + b));
  return static_cast<float>(static_cast<double>(h >> 40) * 0x1p-23 - 1.0);
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::f32:
      return x;
    case DType::bf16:
      return bf16_to_f32(f32_to_bf16(x));
    case DType::f16:
      return f16_to_f32(f32_to_f16(x));
  }
  return x;
}

// DeepSpeed's WarmupLR, as its documentation defines it, at last_batch_iteration `it` (-1 before the first
// scheduler step: the minimum).
double warmup_lr(const SchedulerConfig& s, double max_lr, int64_t it) {
  if (it < 0) return s.warmup_min_lr;
  int64_t n = std::max<int64_t>(2, s.warmup_num_steps.value_or(1000));
  double gamma = 1.0;
  if (it < n) {
    gamma = s.warmup_type == "log" ? std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(n))
                                   : static_cast<double>(it) / static_cast<double>(n);
  }
  return s.warmup_min_lr + (max_lr - s.warmup_min_lr) * gamma;
}

}  // namespace

int64_t MlpParamDesc::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<MlpParamDesc> mlp_params(const MlpDims& d) {
  return {
      {"fc1", "w", {d.h1, d.in}, ParamInit::normal(0.3)}, {"fc1", "b", {d.h1}, ParamInit::uniform(-0.1, 0.1)},
      {"norm", "g", {d.h1}, ParamInit::constant(1.25)},   {"fc2", "w", {d.h2, d.h1}, ParamInit::normal(0.2)},
      {"fc2", "b", {d.h2}, ParamInit::zeros()},           {"head", "w", {d.out, d.h2}, ParamInit::uniform(-0.3, 0.3)},
      {"head", "b", {d.out}, ParamInit::constant(0.05)},
  };
}

std::vector<std::string> mlp_units() { return {"fc1", "norm", "fc2", "head"}; }

Batch make_batch(const MlpDims& dims, uint64_t seed, int64_t index, int64_t batch) {
  Batch b;
  b.size = batch;
  b.x.resize(static_cast<size_t>(batch * dims.in));
  b.t.resize(static_cast<size_t>(batch * dims.out));
  for (int64_t s = 0; s < batch; ++s) {
    uint64_t sample = static_cast<uint64_t>(index * batch + s);
    for (int64_t i = 0; i < dims.in; ++i) b.x[static_cast<size_t>(s * dims.in + i)] = data_value(seed, sample, i);
    for (int64_t o = 0; o < dims.out; ++o) {
      b.t[static_cast<size_t>(s * dims.out + o)] = 0.5f * data_value(seed + 1, sample, o);
    }
  }
  return b;
}

void linear_forward(const float* w, const float* b, const float* x, float* y, int64_t batch, int64_t in, int64_t out) {
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(w[o * in + i]) * x[s * in + i];
      y[s * out + o] = static_cast<float>(acc);
    }
  }
}

void linear_backward(const float* w, const float* x, const float* dy, float* dw, float* db, float* dx, int64_t batch,
                     int64_t in, int64_t out) {
  for (int64_t o = 0; o < out; ++o) {
    double sb = 0;
    for (int64_t s = 0; s < batch; ++s) sb += dy[s * out + o];
    db[o] += static_cast<float>(sb);
    for (int64_t i = 0; i < in; ++i) {
      double sw = 0;
      for (int64_t s = 0; s < batch; ++s) sw += static_cast<double>(dy[s * out + o]) * x[s * in + i];
      dw[o * in + i] += static_cast<float>(sw);
    }
  }
  if (dx == nullptr) return;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t o = 0; o < out; ++o) acc += static_cast<double>(dy[s * out + o]) * w[o * in + i];
      dx[s * in + i] = static_cast<float>(acc);
    }
  }
}

double mse_loss(const std::vector<float>& y, const std::vector<float>& t, int64_t batch, std::vector<float>* dy) {
  double loss = 0;
  if (dy) dy->assign(y.size(), 0.0f);
  for (size_t i = 0; i < y.size(); ++i) {
    double d = static_cast<double>(y[i]) - t[i];
    loss += 0.5 * d * d;
    if (dy) (*dy)[i] = static_cast<float>(d / static_cast<double>(batch));
  }
  return loss / static_cast<double>(batch);
}

ReferenceRun run_reference(const Config& config, const TrainPlan& plan) {
  const MlpDims& d = plan.dims;
  const auto descs = mlp_params(d);
  const DType compute = config.compute_dtype();
  const int64_t gas = config.gradient_accumulation_steps.value_or(1);
  const int world = plan.world;

  // Whole fp32 parameters, from the same counter-based generator the engine uses.
  std::map<std::string, std::vector<float>> p, m, v;
  for (const auto& desc : descs) {
    auto& w = p[desc.full_name()];
    w.resize(static_cast<size_t>(desc.numel()));
    philox_fill_cpu(detail::param_fill(desc.init), config.zero3.seed, philox_stream_id(desc.full_name()), 0, desc.numel(),
                    w.data());
    m[desc.full_name()].assign(w.size(), 0.0f);
    v[desc.full_name()].assign(w.size(), 0.0f);
  }

  const OptimizerConfig& oc = config.optimizer;
  const double base_lr = oc.lr.value_or(1e-3);
  const double wd = oc.weight_decay.value_or(0.0);
  const bool decoupled = oc.type == OptimizerType::adamw || oc.adam_w_mode;
  const double clip = config.gradient_clipping.value_or(0.0);

  ReferenceRun run;
  int64_t applied = 0;
  for (int64_t step = 0; step < plan.steps; ++step) {
    // The weights the layers see.
    std::map<std::string, std::vector<float>> seen;
    for (const auto& [name, w] : p) {
      auto& s = seen[name];
      s.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) s[i] = round_to(compute, w[i]);
    }
    std::map<std::string, std::vector<double>> grad_sum;
    for (const auto& [name, w] : p) grad_sum[name].assign(w.size(), 0.0);
    run.losses.emplace_back();
    for (int64_t micro = 0; micro < gas; ++micro) {
      run.losses.back().emplace_back();
      for (int r = 0; r < world; ++r) {
        Batch b = make_batch(d, plan.data_seed, batch_index(step, micro, gas, r, world), plan.micro_batch);
        const int64_t B = b.size;
        std::vector<float> a1(B * d.h1), a1n(B * d.h1), a2(B * d.h2), y(B * d.out);
        linear_forward(seen["fc1.w"].data(), seen["fc1.b"].data(), b.x.data(), a1.data(), B, d.in, d.h1);
        for (auto& x : a1) x = std::tanh(x);
        for (int64_t s = 0; s < B; ++s)
          for (int64_t j = 0; j < d.h1; ++j) a1n[s * d.h1 + j] = a1[s * d.h1 + j] * seen["norm.g"][j];
        linear_forward(seen["fc2.w"].data(), seen["fc2.b"].data(), a1n.data(), a2.data(), B, d.h1, d.h2);
        for (auto& x : a2) x = std::tanh(x);
        linear_forward(seen["head.w"].data(), seen["head.b"].data(), a2.data(), y.data(), B, d.h2, d.out);
        std::vector<float> dy;
        run.losses.back().back().push_back(mse_loss(y, b.t, B, &dy));

        std::map<std::string, std::vector<float>> g;
        for (const auto& [name, w] : p) g[name].assign(w.size(), 0.0f);
        std::vector<float> da2(B * d.h2), da1n(B * d.h1), da1(B * d.h1), unused(B * d.in);
        linear_backward(seen["head.w"].data(), a2.data(), dy.data(), g["head.w"].data(), g["head.b"].data(), da2.data(),
                        B, d.h2, d.out);
        for (size_t i = 0; i < da2.size(); ++i) da2[i] *= 1.0f - a2[i] * a2[i];
        linear_backward(seen["fc2.w"].data(), a1n.data(), da2.data(), g["fc2.w"].data(), g["fc2.b"].data(), da1n.data(),
                        B, d.h1, d.h2);
        for (int64_t s = 0; s < B; ++s) {
          for (int64_t j = 0; j < d.h1; ++j) {
            g["norm.g"][j] += da1n[s * d.h1 + j] * a1[s * d.h1 + j];
            da1[s * d.h1 + j] = da1n[s * d.h1 + j] * seen["norm.g"][j];
          }
        }
        for (size_t i = 0; i < da1.size(); ++i) da1[i] *= 1.0f - a1[i] * a1[i];
        linear_backward(seen["fc1.w"].data(), b.x.data(), da1.data(), g["fc1.w"].data(), g["fc1.b"].data(), nullptr, B,
                        d.in, d.h1);
        for (const auto& [name, gv] : g) {
          auto& acc = grad_sum[name];
          for (size_t i = 0; i < gv.size(); ++i) acc[i] += gv[i];
        }
      }
    }
    // The data-parallel average over every micro-batch of the step.
    const double n_batches = static_cast<double>(gas * world);
    double sq = 0;
    for (auto& [name, acc] : grad_sum) {
      for (double& x : acc) {
        x /= n_batches;
        sq += x * x;
      }
    }
    double norm = std::sqrt(sq);
    run.grad_norms.push_back(norm);
    double coef = 1.0;
    if (clip > 0 && clip / (norm + 1e-6) < 1.0) coef = clip / (norm + 1e-6);

    double lr = base_lr;
    if (config.scheduler.type == SchedulerType::warmup_lr) {
      lr = warmup_lr(config.scheduler, config.scheduler.warmup_max_lr.value_or(base_lr), applied - 1);
    } else if (config.scheduler.type != SchedulerType::none) {
      throw std::logic_error("the reference implements WarmupLR and a constant lr only");
    }
    run.lrs.push_back(lr);
    ++applied;
    // Textbook Adam (Kingma & Ba) with decoupled (Loshchilov & Hutter) or L2 weight decay.
    const double b1 = oc.beta1, b2 = oc.beta2, eps = oc.eps;
    const double bc1 = oc.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(applied)) : 1.0;
    const double bc2 = oc.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(applied)) : 1.0;
    for (auto& [name, w] : p) {
      auto& mm = m[name];
      auto& vv = v[name];
      const auto& acc = grad_sum[name];
      for (size_t i = 0; i < w.size(); ++i) {
        double grad = acc[i] * coef;
        if (!decoupled) grad += wd * w[i];
        double mi = b1 * mm[i] + (1.0 - b1) * grad;
        double vi = b2 * vv[i] + (1.0 - b2) * grad * grad;
        mm[i] = static_cast<float>(mi);
        vv[i] = static_cast<float>(vi);
        double update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
        double wi = w[i];
        if (decoupled) wi -= lr * wd * wi;
        w[i] = static_cast<float>(wi - lr * update);
      }
    }
  }
  run.params = p;
  return run;
}

}  // namespace zero3::testing

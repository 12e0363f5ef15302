#include "support/mlp_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace zero3::testing {
namespace {

// A parameter view as fp32 values (16-bit compute copies are widened).
std::vector<float> host_to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel));
  for (int64_t i = 0; i < v.numel; ++i) {
    switch (v.dtype) {
      case DType::f32:
        out[i] = v.as<float>()[i];
        break;
      case DType::bf16:
        out[i] = bf16_to_f32(v.as<uint16_t>()[i]);
        break;
      case DType::f16:
        out[i] = f16_to_f32(v.as<uint16_t>()[i]);
        break;
    }
  }
  return out;
}

// Adds fp32 values into a gradient view of any dtype.
void host_add_into(const TensorView& g, const std::vector<float>& values) {
  for (int64_t i = 0; i < g.numel; ++i) {
    float x = values[static_cast<size_t>(i)];
    switch (g.dtype) {
      case DType::f32:
        g.as<float>()[i] += x;
        break;
      case DType::bf16: {
        auto* p = g.as<uint16_t>();
        p[i] = f32_to_bf16(bf16_to_f32(p[i]) + x);
        break;
      }
      case DType::f16: {
        auto* p = g.as<uint16_t>();
        p[i] = f32_to_f16(f16_to_f32(p[i]) + x);
        break;
      }
    }
  }
}

// On a GPU the views are device memory: the layers' CPU math works on host copies.
std::vector<float> to_f32(Device& dev, const TensorView& v) {
  if (dev.type() == DeviceType::cpu) return host_to_f32(v);
  std::vector<uint8_t> bytes(static_cast<size_t>(v.numel) * dtype_size(v.dtype));
  dev.copy(bytes.data(), v.data, bytes.size());
  TensorView h = v;
  h.data = bytes.data();
  return host_to_f32(h);
}

void add_into(Device& dev, const TensorView& g, const std::vector<float>& values) {
  if (dev.type() == DeviceType::cpu) return host_add_into(g, values);
  std::vector<uint8_t> bytes(static_cast<size_t>(g.numel) * dtype_size(g.dtype));
  dev.copy(bytes.data(), g.data, bytes.size());
  TensorView h = g;
  h.data = bytes.data();
  host_add_into(h, values);
  dev.copy(g.data, bytes.data(), bytes.size());
}

}  // namespace

MlpUnits declare_mlp(Engine& engine, const MlpDims& dims) {
  for (const std::string& u : mlp_units()) engine.add_unit(u);
  for (const MlpParamDesc& p : mlp_params(dims)) engine.add_param(*engine.find_unit(p.unit), {p.name, p.shape, p.init});
  return {*engine.find_unit("fc1"), *engine.find_unit("norm"), *engine.find_unit("fc2"), *engine.find_unit("head")};
}

void mlp_forward(Engine& engine, const MlpUnits& units, const MlpDims& d, const Batch& batch, MlpActivations& act) {
  Device& dev = engine.device();
  const int64_t B = batch.size;
  act.a1.assign(B * d.h1, 0.0f);
  act.a1n.assign(B * d.h1, 0.0f);
  act.a2.assign(B * d.h2, 0.0f);
  act.y.assign(B * d.out, 0.0f);
  std::vector<float>&a1 = act.a1, &a1n = act.a1n, &a2 = act.a2, &y = act.y;
  {
    auto s = engine.forward_scope(units.fc1);
    auto w = to_f32(dev, s.param("w")), b = to_f32(dev, s.param("b"));
    linear_forward(w.data(), b.data(), batch.x.data(), a1.data(), B, d.in, d.h1);
    for (auto& x : a1) x = std::tanh(x);
  }
  {
    auto s = engine.forward_scope(units.norm);
    auto g = to_f32(dev, s.param("g"));
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < d.h1; ++j) a1n[i * d.h1 + j] = a1[i * d.h1 + j] * g[j];
  }
  {
    auto s = engine.forward_scope(units.fc2);
    auto w = to_f32(dev, s.param("w")), b = to_f32(dev, s.param("b"));
    linear_forward(w.data(), b.data(), a1n.data(), a2.data(), B, d.h1, d.h2);
    for (auto& x : a2) x = std::tanh(x);
  }
  {
    auto s = engine.forward_scope(units.head);
    auto w = to_f32(dev, s.param("w")), b = to_f32(dev, s.param("b"));
    linear_forward(w.data(), b.data(), a2.data(), y.data(), B, d.h2, d.out);
  }
}

double mlp_eval_loss(Engine& engine, const MlpUnits& units, const MlpDims& d, const Batch& batch) {
  MlpActivations act;
  mlp_forward(engine, units, d, batch, act);
  return mse_loss(act.y, batch.t, batch.size, nullptr);
}

double mlp_micro_step(Engine& engine, const MlpUnits& units, const MlpDims& d, const Batch& batch, bool plant,
                      float plant_value) {
  Device& dev = engine.device();
  const int64_t B = batch.size;
  MlpActivations act;
  mlp_forward(engine, units, d, batch, act);
  const std::vector<float>&a1 = act.a1, &a1n = act.a1n, &a2 = act.a2, &y = act.y;
  std::vector<float> dy;
  double loss = mse_loss(y, batch.t, B, &dy);
  const float scale = static_cast<float>(engine.loss_scale());
  if (scale != 1.0f) {
    for (auto& x : dy) x *= scale;
  }
  std::vector<float> da2(B * d.h2), da1n(B * d.h1), da1(B * d.h1);
  {
    auto s = engine.backward_scope(units.head);
    auto w = to_f32(dev, s.param("w"));
    std::vector<float> gw(d.out * d.h2, 0.0f), gb(d.out, 0.0f);
    linear_backward(w.data(), a2.data(), dy.data(), gw.data(), gb.data(), da2.data(), B, d.h2, d.out);
    add_into(dev, s.grad("w"), gw);
    add_into(dev, s.grad("b"), gb);
  }
  for (size_t i = 0; i < da2.size(); ++i) da2[i] *= 1.0f - a2[i] * a2[i];
  {
    auto s = engine.backward_scope(units.fc2);
    auto w = to_f32(dev, s.param("w"));
    std::vector<float> gw(d.h2 * d.h1, 0.0f), gb(d.h2, 0.0f);
    linear_backward(w.data(), a1n.data(), da2.data(), gw.data(), gb.data(), da1n.data(), B, d.h1, d.h2);
    if (plant) gw[0] += plant_value;
    add_into(dev, s.grad("w"), gw);
    add_into(dev, s.grad("b"), gb);
  }
  {
    auto s = engine.backward_scope(units.norm);
    auto g = to_f32(dev, s.param("g"));
    std::vector<float> gg(d.h1, 0.0f);
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t j = 0; j < d.h1; ++j) {
        gg[j] += da1n[i * d.h1 + j] * a1[i * d.h1 + j];
        da1[i * d.h1 + j] = da1n[i * d.h1 + j] * g[j];
      }
    }
    add_into(dev, s.grad("g"), gg);
  }
  for (size_t i = 0; i < da1.size(); ++i) da1[i] *= 1.0f - a1[i] * a1[i];
  {
    auto s = engine.backward_scope(units.fc1);
    auto w = to_f32(dev, s.param("w"));
    std::vector<float> gw(d.h1 * d.in, 0.0f), gb(d.h1, 0.0f);
    linear_backward(w.data(), batch.x.data(), da1.data(), gw.data(), gb.data(), nullptr, B, d.in, d.h1);
    add_into(dev, s.grad("w"), gw);
    add_into(dev, s.grad("b"), gb);
  }
  return loss;
}

EngineRun train_mlp(Engine& engine, const MlpUnits& units, const TrainPlan& plan) {
  EngineRun run;
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t step = 0; step < plan.steps; ++step) {
    for (int64_t micro = 0; micro < gas; ++micro) {
      Batch b = make_batch(plan.dims, plan.data_seed, batch_index(step, micro, gas, engine.rank(), engine.world_size()),
                           plan.micro_batch);
      run.losses.push_back(mlp_micro_step(engine, units, plan.dims, b));
      run.steps.push_back(engine.step());
    }
  }
  run.params = gather_params(engine);
  return run;
}

Config equivalence_config(int stage) {
  Config c;
  c.zero.stage = stage;
  c.gradient_accumulation_steps = 2;
  c.train_micro_batch_size_per_gpu = 3;
  c.gradient_clipping = 0.5;
  c.optimizer.present = true;
  c.optimizer.type = OptimizerType::adamw;
  c.optimizer.lr = 2e-2;
  c.optimizer.weight_decay = 0.01;
  c.scheduler.type = SchedulerType::warmup_lr;
  c.scheduler.warmup_min_lr = 1e-3;
  c.scheduler.warmup_max_lr = 2e-2;
  c.scheduler.warmup_num_steps = 4;
  c.scheduler.warmup_type = "linear";
  c.zero.reduce_bucket_size = 400;
  c.zero.param_persistence_threshold = 40;
  c.zero.prefetch_bucket_size = 1000;
  c.zero3.seed = 1234;
  return c;
}

double max_relative_error(const std::map<std::string, std::vector<float>>& a,
                          const std::map<std::string, std::vector<float>>& b, std::string* worst) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double max_err = 0;
  for (const auto& [name, bv] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.size() != bv.size()) return std::numeric_limits<double>::infinity();
    double ss = 0;
    for (float x : bv) ss += static_cast<double>(x) * x;
    double rms = std::sqrt(ss / static_cast<double>(std::max<size_t>(bv.size(), 1)));
    for (size_t i = 0; i < bv.size(); ++i) {
      double err =
          std::fabs(static_cast<double>(it->second[i]) - bv[i]) / std::max(std::fabs(static_cast<double>(bv[i])), rms);
      if (!(err <= max_err)) {
        max_err = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
        if (worst) *worst = name + "[" + std::to_string(i) + "]";
      }
    }
  }
  return max_err;
}

std::map<std::string, std::vector<float>> gather_params(Engine& engine) {
  std::map<std::string, std::vector<float>> out;
  for (size_t u = 0; u < engine.num_units(); ++u) {
    const UnitInfo& info = engine.unit(UnitId{static_cast<int32_t>(u)});
    std::vector<float> flat(static_cast<size_t>(info.numel));
    engine.gather_master_params(info.id, flat.data());
    for (ParamId pid : info.params) {
      const ParamInfo& p = engine.param(pid);
      out[p.name].assign(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
    }
  }
  return out;
}

std::vector<float> local_optimizer_state(Engine& engine) {
  std::vector<float> out;
  for (size_t u = 0; u < engine.num_units(); ++u) {
    ShardView v = engine.local_shard(UnitId{static_cast<int32_t>(u)});
    out.insert(out.end(), v.master, v.master + v.length);
    out.insert(out.end(), v.exp_avg, v.exp_avg + v.length);
    out.insert(out.end(), v.exp_avg_sq, v.exp_avg_sq + v.length);
  }
  return out;
}

}  // namespace zero3::testing

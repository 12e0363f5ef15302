#include "support/libtorch_training.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <unordered_set>

#include "zero3/engine.hpp"

namespace zero3::testing {
namespace {

at::Tensor micro_loss(const std::shared_ptr<torch::nn::Module>& model, const TinyLlamaConfig& c, const at::Tensor& batch) {
  const int64_t T = c.seq;
  at::Tensor logits = tiny_llama_logits(model, batch.slice(1, 0, T));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, c.vocab}).to(at::kFloat),
                                              batch.slice(1, 1, T + 1).reshape({-1}));
}

// The model's parameters once each (a tied weight is listed under two names), with their first names.
std::vector<std::pair<std::string, at::Tensor>> unique_params(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

at::Tensor token_batch(const TinyLlamaConfig& model, const TrainSpec& spec, int64_t step, int64_t index) {
  // A fixed pattern with some structure to learn: each sequence walks the vocabulary with a stride of its own.
  const uint64_t sequence0 =
      (static_cast<uint64_t>(step) * 131 + static_cast<uint64_t>(index)) * static_cast<uint64_t>(spec.micro_batch);
  at::Tensor ids = torch::empty({spec.micro_batch, model.seq + 1}, torch::kLong);
  auto a = ids.accessor<int64_t, 2>();
  for (int64_t b = 0; b < spec.micro_batch; ++b) {
    const uint64_t s = (sequence0 + static_cast<uint64_t>(b)) * 2654435761u + spec.data_seed;
    const uint64_t stride = 1 + s % 5, start = (s >> 8) % static_cast<uint64_t>(model.vocab);
    for (int64_t t = 0; t <= model.seq; ++t) {
      a[b][t] = static_cast<int64_t>((start + stride * static_cast<uint64_t>(t) + (s >> (t % 16)) % 2) %
                                     static_cast<uint64_t>(model.vocab));
    }
  }
  return ids;
}

TrainRun train_plain_libtorch(const TinyLlamaConfig& c, uint64_t seed, const TrainSpec& spec) {
  std::shared_ptr<torch::nn::Module> model = make_tiny_llama(c, seed);
  std::vector<at::Tensor> params;
  for (auto& [name, t] : unique_params(*model)) params.push_back(t);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weight_decay).betas({0.9, 0.999}).eps(1e-8));
  TrainRun run;
  const double parts = static_cast<double>(spec.world * spec.gas);
  for (int64_t step = 0; step < spec.steps; ++step) {
    opt.zero_grad();
    double loss_sum = 0;
    for (int64_t k = 0; k < spec.gas; ++k) {
      for (int r = 0; r < spec.world; ++r) {
        at::Tensor loss = micro_loss(model, c, token_batch(c, spec, step, k * spec.world + r));
        loss_sum += loss.item<double>();
        (loss / parts).backward();
      }
    }
    run.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(params, spec.clip > 0 ? spec.clip : 1e30));
    opt.step();
    run.losses.push_back(loss_sum / parts);
  }
  for (auto& [name, t] : unique_params(*model)) {
    at::Tensor v = t.detach().to(at::kFloat).contiguous();
    run.params[name].assign(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
  }
  return run;
}

Config libtorch_test_config(int stage, const TrainSpec& spec) {
  Config c;
  c.zero.stage = stage;
  c.gradient_accumulation_steps = spec.gas;
  c.train_micro_batch_size_per_gpu = spec.micro_batch;
  c.gradient_clipping = spec.clip;
  c.optimizer.present = true;
  c.optimizer.type = OptimizerType::adamw;
  c.optimizer.lr = spec.lr;
  c.optimizer.weight_decay = spec.weight_decay;
  c.zero.reduce_bucket_size = 700;
  c.zero.param_persistence_threshold = 30;
  c.zero.prefetch_bucket_size = 3000;
  return c;
}

TrainRun train_sharded(libtorch::ShardedModel& sharded, const TinyLlamaConfig& c, const TrainSpec& spec,
                       int64_t first_step) {
  Engine& engine = sharded.engine();
  TrainRun run;
  for (int64_t step = first_step; step < first_step + spec.steps; ++step) {
    float loss_sum = 0;
    for (int64_t k = 0; k < engine.gradient_accumulation_steps(); ++k) {
      at::Tensor loss = micro_loss(sharded.module(), c, token_batch(c, spec, step, k * engine.world_size() + engine.rank()));
      sharded.backward(loss);
      const StepResult r = sharded.step();
      if (r.boundary) run.grad_norms.push_back(r.grad_norm);
      loss_sum += loss.item<float>();
    }
    engine.all_reduce_host(&loss_sum, 1, ReduceOp::avg);
    run.losses.push_back(loss_sum / static_cast<double>(engine.gradient_accumulation_steps()));
  }
  run.params = to_param_map(sharded.gather_state_dict());
  return run;
}

ParamMap to_param_map(const torch::OrderedDict<std::string, at::Tensor>& state) {
  ParamMap out;
  for (const auto& item : state) {
    at::Tensor v = item.value().to(at::kFloat).contiguous();
    out[item.key()].assign(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
  }
  return out;
}

}  // namespace zero3::testing

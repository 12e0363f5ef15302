// The libtorch adapter's contract beyond plain training: evaluation, a checkpointed unit with dropout, bf16, and
// every misuse the adapter names instead of computing a wrong gradient (docs/libtorch.md, "Errors").
// zero3-test-ranks: 1 2
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <functional>
#include <string>

#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"
#include "support/mlp_trainer.hpp"

namespace zero3::testing {
namespace {

using libtorch::ShardedModel;
using libtorch::WrapOptions;

// A unit: x * w, or what the test puts in `body`.
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(int64_t n) { w = register_parameter("w", torch::full({n}, 1.5)); }
  at::Tensor forward(const at::Tensor& x) { return body ? body(*this, x) : x * w; }
  at::Tensor w;
  std::function<at::Tensor(ScaleImpl&, const at::Tensor&)> body;
};
TORCH_MODULE(Scale);

// The model: units a and b called one after the other, and a root parameter `bias`.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", Scale(4));
    b = register_module("b", Scale(4));
    bias = register_parameter("bias", torch::full({4}, 0.25));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = call_b_directly ? b->forward(zero3::libtorch::call(a, x)) : zero3::libtorch::call(b, zero3::libtorch::call(a, x));
    return h + bias;
  }
  Scale a{nullptr}, b{nullptr};
  at::Tensor bias;
  bool call_b_directly = false;  // the misuse: b(x) instead of call(b, x)
};
TORCH_MODULE(Net);

std::unique_ptr<Engine> make_engine(int stage = 3, bool bf16 = false) {
  TrainSpec spec;
  spec.world = engine_world()->size();
  Config c = libtorch_test_config(stage, spec);
  c.bf16.enabled = bf16;
  return std::make_unique<Engine>(resolved_for(c, *engine_world()), engine_world(), cpu_device());
}

at::Tensor input() { return torch::arange(8, torch::kFloat).view({2, 4}) / 8; }

// Runs `what` and expects a zero3::Error whose message contains `needle` (errors raised inside backward reach the
// caller through libtorch's autograd engine, which keeps their type).
template <typename F>
void expect_error(F&& what, const std::string& needle) {
  try {
    what();
    ADD_FAILURE() << "no error; expected one saying \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a zero3::Error: " << e.what();
  }
}

struct Wrapped {
  std::unique_ptr<Engine> engine;
  Net net;
  std::unique_ptr<ShardedModel> sharded;
};

Wrapped wrap_net(std::vector<std::string> checkpoint = {}) {
  Wrapped w{make_engine(), Net(), nullptr};
  WrapOptions o;
  o.units = {"a", "b"};
  o.checkpoint = std::move(checkpoint);
  w.sharded = std::make_unique<ShardedModel>(*w.engine, w.net.ptr(), o);
  w.sharded->materialize();
  return w;
}

TEST(LibtorchWrap, RefusesBadUnitsAndParameters) {
  auto engine = make_engine();
  Net net;
  expect_error([&] { ShardedModel{*engine, net.ptr(), WrapOptions{.units = {"a", "c"}}}; }, "'c' is not a submodule");
  expect_error([&] { ShardedModel{*engine, net.ptr(), WrapOptions{.units = {"a"}, .checkpoint = {"b"}}}; },
               "not one of WrapOptions::units");
  expect_error([&] { ShardedModel{*make_engine(), net.ptr(), WrapOptions{.units = {"a"}, .root_unit = "a"}}; },
               "root unit's name");
  net->b->w.set_requires_grad(false);
  expect_error([&] { ShardedModel{*make_engine(), net.ptr(), WrapOptions{.units = {"a", "b"}}}; },
               "parameter 'b.w' does not require gradients");
  net->b->w.set_requires_grad(true);
  expect_error([&] { ShardedModel{*make_engine(/*stage=*/3, /*bf16=*/true), net.ptr(), WrapOptions{.units = {"a"}}}; },
               "convert the model with model->to()");
  auto first_engine = make_engine();
  ShardedModel first(*first_engine, net.ptr(), WrapOptions{.units = {"a", "b"}});
  expect_error([&] { ShardedModel{*make_engine(), net.ptr(), WrapOptions{.units = {"a", "b"}}}; },
               "already wrapped by another ShardedModel");
}

TEST(LibtorchWrap, ACheckpointedUnitMayNotHoldAnotherUnitsParameter) {
  Net net;
  net->b->register_parameter("tied", net->a->w);  // a.w is also b.tied: shared by two units, it belongs to the root
  for (const std::string unit : {"a", "b"}) {
    expect_error([&] { ShardedModel{*make_engine(), net.ptr(), WrapOptions{.units = {"a", "b"}, .checkpoint = {unit}}}; },
                 "checkpointed unit '" + unit + "' uses parameter '" + (unit == "a" ? "a.w" : "b.tied") +
                     "', which is registered as 'a.w' and 'b.tied' and so belongs to the root unit 'root'");
  }
  auto engine = make_engine();
  ShardedModel unchecked(*engine, net.ptr(), WrapOptions{.units = {"a", "b"}});  // without checkpointing: fine
}

TEST(LibtorchWrap, NestedUnitsAreRefused) {
  auto engine = make_engine();
  auto outer = std::make_shared<torch::nn::Module>();
  auto inner = outer->register_module("inner", std::make_shared<torch::nn::Module>());
  inner->register_module("leaf", torch::nn::Linear(2, 2));
  expect_error([&] { ShardedModel{*engine, outer, WrapOptions{.units = {"inner", "inner.leaf"}}}; },
               "unit 'inner.leaf' lies inside unit 'inner'");
}

TEST(LibtorchCalls, UnitsAreCalledInsideTheModelInTraining) {
  Wrapped w = wrap_net();
  expect_error([&] { zero3::libtorch::call(w.net->a, input()); }, "called outside the model's call");
  {
    at::NoGradGuard no_grad;
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "outside evaluation");
  }
  w.net->a->body = [](ScaleImpl& self, const at::Tensor& x) { return zero3::libtorch::call(&self, x) * self.w; };
  expect_error([&] { zero3::libtorch::call(w.net, input()); }, "called inside its own call");
}

TEST(LibtorchCalls, AUnitCalledDirectlyIsNamed) {
  for (const bool evaluating : {false, true}) {
    SCOPED_TRACE(evaluating ? "evaluation" : "training");
    Wrapped w = wrap_net();
    w.net->call_b_directly = true;
    EvalMode eval;
    if (evaluating) eval = w.sharded->evaluate();
    expect_error([&] { zero3::libtorch::call(w.net, input()); },
                 "the model (root unit 'root') used parameter 'b.w' of unit 'b', whose unit is not in use: aten::mul "
                 "saw the parameter empty");
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "call it through zero3::libtorch::call(b, x)");
  }
}

TEST(LibtorchCalls, TensorsOutsideTheUnitAreRefused) {
  {  // a tensor that requires gradients but is registered nowhere
    Wrapped w = wrap_net();
    at::Tensor loose = torch::ones({4}, torch::requires_grad());
    w.net->a->body = [loose](ScaleImpl& self, const at::Tensor& x) { return x * self.w * loose; };
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "belongs to no unit");
  }
  {  // a parameter of a unit that is not in use (empty here, so torch computes on nothing without complaint)
    Wrapped w = wrap_net();
    at::Tensor other = w.net->b->w;
    w.net->a->body = [other](ScaleImpl& self, const at::Tensor& x) { return x * self.w + other.sum(); };
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "parameter 'b.w' of unit 'b', whose unit is not in use");
  }
  {  // a tensor kept from a parameter before the call (here from before wrapping: stale values)
    Net net;
    at::Tensor kept = net->a->w * 2;
    auto engine = make_engine();
    ShardedModel sharded(*engine, net.ptr(), WrapOptions{.units = {"a", "b"}});
    sharded.materialize();
    net->a->body = [kept](ScaleImpl& self, const at::Tensor& x) { return x * self.w * kept; };
    expect_error([&] { zero3::libtorch::call(net, input()); }, "computed before the call");
  }
  {  // an output that is the unit's parameter itself
    Wrapped w = wrap_net();
    w.net->a->body = [](ScaleImpl& self, const at::Tensor&) { return self.w; };
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "a view of its parameter 'a.w'");
  }
}

TEST(LibtorchCalls, ChangesAfterWrappingAreRefused) {
  {
    Wrapped w = wrap_net();
    w.net->b->register_parameter("extra", torch::zeros({3}));
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "'b.extra' is not the tensor the ShardedModel wrapped");
  }
  {
    Wrapped w = wrap_net();
    w.net->a->w.register_hook([](const at::Tensor& g) { return g * 2; });
    expect_error([&] { zero3::libtorch::call(w.net, input()); }, "parameter 'a.w' has a gradient hook");
  }
}

TEST(LibtorchCalls, TheOptimizerIsZero3s) {
  Wrapped w = wrap_net();
  torch::optim::AdamW adamw(w.net->parameters(), torch::optim::AdamWOptions(0.1));
  at::Tensor loss = zero3::libtorch::call(w.net, input()).sum();
  loss.backward();
  for (const at::Tensor& p : w.net->parameters()) {
    EXPECT_FALSE(p.grad().defined());  // the gradients went to zero3's reducer
    EXPECT_EQ(p.numel(), 0);
  }
  adamw.step();
  expect_error([&] { zero3::libtorch::call(w.net, input()); }, "torch::optim sees only empty parameters");
}

TEST(LibtorchCalls, BackwardBelongsToItsMicroStep) {
  {
    Wrapped w = wrap_net();
    at::Tensor loss = zero3::libtorch::call(w.net, input()).sum();
    w.sharded->step();
    expect_error([&] { loss.backward(); }, "call backward before step()");
  }
  {
    Wrapped w = wrap_net();
    at::Tensor loss = zero3::libtorch::call(w.net, input()).sum();
    loss.backward({}, /*retain_graph=*/true);
    expect_error([&] { loss.backward(); }, "a second backward through");
  }
}

// The same batch evaluated (ShardedModel::evaluate, no gradients) gives the training forward's outputs, and
// evaluating leaves training as it was.
TEST(LibtorchEvaluation, MatchesTheTrainingForward) {
  Wrapped w = wrap_net();
  at::Tensor first = zero3::libtorch::call(w.net, input());
  w.sharded->backward(first.pow(2).sum());
  w.sharded->step();
  at::Tensor eval_out;
  {
    EvalMode eval = w.sharded->evaluate();
    eval_out = zero3::libtorch::call(w.net, input());
    EXPECT_FALSE(eval_out.requires_grad());
  }
  at::Tensor train_out = zero3::libtorch::call(w.net, input());
  EXPECT_TRUE(torch::equal(eval_out, train_out.detach())) << eval_out << train_out;
  EXPECT_FALSE(torch::equal(train_out.detach(), first.detach()));  // the step changed the weights
  w.sharded->backward(train_out.sum());
  w.sharded->step();
}

// With dropout, a checkpointed block recomputes its forward in backward with the random state of the forward:
// training with and without checkpointing gives the same weights, and different ones than without dropout.
TEST(LibtorchCheckpointing, RecomputesWithTheForwardsRandomState) {
  auto world = engine_world();
  TinyLlamaConfig c;
  c.attn_dropout = 0.2;
  TrainSpec spec;
  spec.world = world->size();
  auto train = [&](bool checkpoint, double dropout) {
    TinyLlamaConfig mc = c;
    mc.attn_dropout = dropout;
    Engine engine(resolved_for(libtorch_test_config(3, spec), *world), world, cpu_device());
    WrapOptions o;
    o.units = tiny_llama_units(mc);
    if (checkpoint) o.checkpoint = {"blocks.0", "blocks.1", "blocks.2"};
    ShardedModel sharded(engine, make_tiny_llama(mc, 99), o);
    sharded.materialize();
    return train_sharded(sharded, mc, spec).params;
  };
  const ParamMap plain = train(false, 0.2), checkpointed = train(true, 0.2), no_dropout = train(false, 0.0);
  std::string worst;
  EXPECT_LE(max_relative_error(checkpointed, plain, &worst), 1e-6) << worst;
  EXPECT_GT(max_relative_error(no_dropout, plain, &worst), 1e-3);
}

// bf16 compute (the config's bf16 section, the model converted with model->to(torch::kBFloat16)) follows the fp32
// reference within bf16's precision: the losses and the gradient norms of three steps. (Not the weights: Adam's
// first steps move each weight by about lr times the sign of its gradient, and bf16 flips the sign of the smallest.)
TEST(LibtorchPrecision, Bf16FollowsTheFp32Reference) {
  auto world = engine_world();
  TinyLlamaConfig c;
  TrainSpec spec;
  spec.world = world->size();
  const TrainRun want = train_plain_libtorch(c, 5, spec);
  Config config = libtorch_test_config(3, spec);
  config.bf16.enabled = true;
  Engine engine(resolved_for(config, *world), world, cpu_device());
  auto model = make_tiny_llama(c, 5);
  model->to(torch::kBFloat16);
  ShardedModel sharded(engine, model, WrapOptions{.units = tiny_llama_units(c)});
  sharded.materialize();
  const TrainRun got = train_sharded(sharded, c, spec);
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 0.01 * want.losses[s]) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], want.grad_norms[s], 0.03 * want.grad_norms[s]) << "step " << s;
  }
}

}  // namespace
}  // namespace zero3::testing

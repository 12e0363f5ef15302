// ModelRunner on the CPU backend, and EngineModel (which runs it inside the engine's scopes), against the reference
// model_forward_backward of llama_model.cpp: the loss and every gradient must be the same bits, with and without
// activation checkpointing, over two accumulated micro-batches, with a given normalizer and small loss chunks; with
// bf16 compute the engine's model must equal the reference run on the bf16-rounded (widened) weights. Deferred
// losses (summed in the backend, read once per window) give the host sum's bits.
//
// Odd sizes as in test_model.cpp: hidden 12, 3 query heads on 1 kv head (head_dim 4), ffn 20, vocab 17, seq 5;
// untied and tied embeddings (the head multiplies by the embedding unit's weight and adds to its gradient).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cpu_model_ops.hpp"
#include "engine_model.hpp"
#include "grad_check.hpp"
#include "llama_model.hpp"
#include "model_runner.hpp"
#include "support/engine_world.hpp"
#include "zero3/comm.hpp"
#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"
#include "zero3/error.hpp"

using namespace llama3;
using llama3::testing::random_vector;

namespace {

ModelConfig odd_config(bool tied = false) {
  return parse_model_config(std::string(R"({"hidden_size": 12, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 3, "num_key_value_heads": 1, "vocab_size": 17, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-5, "initializer_range": 0.3, "max_position_embeddings": 64, "tie_word_embeddings": )") +
                            (tied ? "true}" : "false}"));
}

struct Batch {
  BatchShape shape{2, 5};
  std::vector<int32_t> ids, targets;
};

Batch batch(int k) {
  Batch b;
  if (k == 0) {
    b.ids = {3, 16, 0, 7, 7, 1, 2, 3, 4, 5};
    b.targets = {16, 0, kIgnoreIndex, 7, 1, 2, kIgnoreIndex, 4, 5, 9};
  } else {
    b.ids = {9, 9, 1, 0, 16, 15, 4, 4, 2, 11};
    b.targets = {9, 1, 0, 16, 15, 4, 4, kIgnoreIndex, 11, 3};
  }
  return b;
}

// Norm weights drawn around 1 (not exactly 1) so their gradients are exercised too.
void randomize(FlatModel<float>& m, uint64_t seed) {
  m.init_random(seed);
  for (size_t u = 0; u < m.units().size(); ++u)
    for (const ParamSpec& p : m.units()[u].params)
      if (p.init == ParamInit::ones) {
        auto noise = random_vector<float>(p.numel, seed + u * 31 + p.offset, 0.3);
        for (int64_t i = 0; i < p.numel; ++i) m.unit_params(u)[p.offset + i] += noise[i];
      }
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (differ++ == 0) first = i;
    }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " elements differ, the first at " << first
                        << " (" << (first < got.size() ? got[first] : 0.0f) << " vs "
                        << (first < got.size() ? want[first] : 0.0f) << ")";
}

// One micro-batch through the runner, units in the engine's order.
LossResult run(ModelRunner& r, FlatModel<float>& m, const Batch& b, bool checkpointing, const LossOptions& lo) {
  const int64_t L = m.config().num_hidden_layers;
  r.begin_batch(b.ids.data(), b.targets.data(), b.shape, checkpointing);
  r.embed_forward(m.unit_params(0).data());
  for (int64_t i = 0; i < L; ++i) r.layer_forward(i, m.unit_params(static_cast<size_t>(1 + i)).data());
  const size_t head = static_cast<size_t>(L + 1);
  LossResult loss = m.config().tie_word_embeddings
                        ? r.head_forward_backward(m.unit_params(head).data(), m.unit_grads(head).data(), lo,
                                                  m.unit_params(0).data(), m.unit_grads(0).data())
                        : r.head_forward_backward(m.unit_params(head).data(), m.unit_grads(head).data(), lo);
  for (int64_t i = L - 1; i >= 0; --i)
    r.layer_backward(i, m.unit_params(static_cast<size_t>(1 + i)).data(),
                     m.unit_grads(static_cast<size_t>(1 + i)).data());
  r.embed_backward(m.unit_grads(0).data());
  return loss;
}

struct RunnerCase {
  bool checkpointing;
  LossOptions loss;
  std::string name;
  bool tied = false;
};

void PrintTo(const RunnerCase& c, std::ostream* os) { *os << c.name; }

class RunnerOnCpu : public ::testing::TestWithParam<RunnerCase> {};

TEST_P(RunnerOnCpu, EqualsModelForwardBackwardBitForBit) {
  const RunnerCase& rc = GetParam();
  const ModelConfig c = odd_config(rc.tied);
  FlatModel<float> ref(c), got(c);
  randomize(ref, 11);
  randomize(got, 11);
  CpuModelOps ops;
  ModelRunner runner(c, ops);
  ModelOptions mo;
  mo.activation_checkpointing = rc.checkpointing;
  mo.loss = rc.loss;
  for (int k = 0; k < 2; ++k) {  // gradients accumulate over two micro-batches, buffers are reused
    const Batch b = batch(k);
    const LossResult want =
        model_forward_backward(c, ref.params(), ref.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape, mo);
    const LossResult have = run(runner, got, b, rc.checkpointing, rc.loss);
    EXPECT_EQ(have.loss, want.loss) << "micro-batch " << k;
    EXPECT_EQ(have.loss_sum, want.loss_sum) << "micro-batch " << k;
    EXPECT_EQ(have.count, want.count) << "micro-batch " << k;
    EXPECT_EQ(have.normalizer, want.normalizer) << "micro-batch " << k;
  }
  for (size_t u = 0; u < ref.units().size(); ++u)
    expect_same_bits(got.unit_grads(u), ref.unit_grads(u), "gradient of unit " + ref.units()[u].name);
}

LossOptions with(double normalizer, int64_t chunk_rows) {
  LossOptions o;
  o.normalizer = normalizer;
  o.chunk_rows = chunk_rows;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Llama, RunnerOnCpu,
    ::testing::Values(RunnerCase{true, {}, "checkpointing"}, RunnerCase{false, {}, "no_checkpointing"},
                      RunnerCase{true, with(32, 3), "checkpointing_normalizer_chunk3"},
                      RunnerCase{false, with(32, 3), "no_checkpointing_normalizer_chunk3"},
                      RunnerCase{true, {}, "tied_checkpointing", true},
                      RunnerCase{false, with(32, 3), "tied_no_checkpointing_normalizer_chunk3", true}),
    [](const ::testing::TestParamInfo<RunnerCase>& i) { return i.param.name; });

// Deferred losses (LossOptions::defer_loss_sum, what train_main runs): each head returns its count and
// normalizer with a NaN loss, take_loss_sum() returns the sum over the deferred micro-batches with the bits of
// adding the immediate heads' loss_sum on the host, in order, and the gradients are the immediate run's. A head that
// returns its loss while deferred sums wait is refused; a take with nothing deferred is 0.
TEST(Runner, DeferredLossSumIsTheHostSumBitForBit) {
  const ModelConfig c = odd_config();
  FlatModel<float> now(c), later(c);
  randomize(now, 5);
  randomize(later, 5);
  CpuModelOps ops_now, ops_later;
  ModelRunner immediate(c, ops_now), deferred(c, ops_later);
  LossOptions lo = with(29, 3), lo_deferred = lo;
  lo_deferred.defer_loss_sum = true;
  double want = 0;
  for (int k : {0, 1, 0}) {  // three micro-batches of one window
    const LossResult a = run(immediate, now, batch(k), true, lo);
    want += a.loss_sum;
    const LossResult d = run(deferred, later, batch(k), true, lo_deferred);
    EXPECT_TRUE(std::isnan(d.loss) && std::isnan(d.loss_sum)) << "micro-batch " << k;
    EXPECT_EQ(d.count, a.count);
    EXPECT_EQ(d.normalizer, a.normalizer);
  }
  ASSERT_GT(want, 0.0);
  EXPECT_THROW(run(deferred, later, batch(1), true, lo), zero3::InvalidArgument);
  const double have = deferred.take_loss_sum();
  EXPECT_EQ(std::memcmp(&have, &want, sizeof(double)), 0) << have << " vs " << want;
  EXPECT_EQ(deferred.take_loss_sum(), 0.0);
  for (size_t u = 0; u < now.units().size(); ++u)
    expect_same_bits(later.unit_grads(u), now.unit_grads(u), "gradient of unit " + now.units()[u].name);
  // Taken: a head may return its loss again, the immediate one's.
  const LossResult again = run(deferred, later, batch(1), true, lo);
  EXPECT_EQ(again.loss_sum, run(immediate, now, batch(1), true, lo).loss_sum);
}

TEST(Runner, HoldsTheBuffersItsSizesSay) {
  const ModelConfig c = odd_config();
  CpuModelOps ops;
  ModelRunner runner(c, ops);
  const Batch b = batch(0);
  for (bool checkpointing : {true, false}) {
    ModelRunner r(c, ops);
    r.begin_batch(b.ids.data(), b.targets.data(), b.shape, checkpointing);
    EXPECT_EQ(r.allocated_bytes(), runner_buffer_sizes(c, b.shape, checkpointing, 4).total())
        << "checkpointing " << checkpointing;
  }
  // Turning checkpointing on frees the other layers' caches; a smaller batch reuses the buffers.
  runner.begin_batch(b.ids.data(), b.targets.data(), b.shape, false);
  runner.begin_batch(b.ids.data(), b.targets.data(), b.shape, true);
  EXPECT_EQ(runner.allocated_bytes(), runner_buffer_sizes(c, b.shape, true, 4).total());
  EXPECT_EQ(runner.peak_allocated_bytes(), runner_buffer_sizes(c, b.shape, false, 4).total());
  runner.begin_batch(b.ids.data(), b.targets.data(), BatchShape{1, 5}, true);
  EXPECT_EQ(runner.allocated_bytes(), runner_buffer_sizes(c, b.shape, true, 4).total());
}

// Pipeline stages (pipeline_model.hpp): the model over two runners with layer ranges, the boundary activation and its
// gradient copied between them, gives the whole runner's loss and gradients bit for bit, with and without
// checkpointing; a range runs neither the embedding nor the head it does not reach.
TEST(Runner, LayerRangesChainToTheWholeModel) {
  const ModelConfig c = odd_config();
  for (bool checkpointing : {true, false}) {
    FlatModel<float> ref(c), got(c);
    randomize(ref, 5);
    randomize(got, 5);
    CpuModelOps ops;
    ModelRunner whole(c, ops), first(c, ops), last(c, ops);
    const Batch b = batch(1);
    const LossResult want = run(whole, ref, b, checkpointing, {});
    first.set_layer_range(0, 1);  // embedding, layers.0
    last.set_layer_range(1, 2);   // layers.1, head
    std::vector<float> boundary(static_cast<size_t>(b.shape.tokens() * c.hidden_size));
    first.begin_batch(b.ids.data(), b.targets.data(), b.shape, checkpointing);
    first.embed_forward(got.unit_params(0).data());
    first.layer_forward(0, got.unit_params(1).data());
    first.store_layer_input(1, boundary.data());
    last.begin_batch(b.ids.data(), b.targets.data(), b.shape, checkpointing);
    last.load_layer_input(1, boundary.data());
    last.layer_forward(1, got.unit_params(2).data());
    const LossResult loss = last.head_forward_backward(got.unit_params(3).data(), got.unit_grads(3).data(), {});
    last.layer_backward(1, got.unit_params(2).data(), got.unit_grads(2).data());
    last.store_grad(boundary.data());
    first.load_grad(boundary.data());
    first.layer_backward(0, got.unit_params(1).data(), got.unit_grads(1).data());
    first.embed_backward(got.unit_grads(0).data());
    EXPECT_EQ(loss.loss, want.loss);
    for (size_t u = 0; u < 4; ++u) expect_same_bits(got.unit_grads(u), ref.unit_grads(u), "unit " + std::to_string(u));
    EXPECT_THROW(last.embed_forward(got.unit_params(0).data()), zero3::InvalidArgument);
    EXPECT_THROW(first.head_forward_loss(got.unit_params(3).data(), {}), zero3::InvalidArgument);
    EXPECT_THROW(first.layer_forward(1, got.unit_params(2).data()), zero3::InvalidArgument);
    EXPECT_THROW(first.store_layer_input(2, boundary.data()), zero3::InvalidArgument);
    EXPECT_THROW(first.set_layer_range(1, 3), zero3::InvalidArgument);
  }
}

TEST(Runner, RefusesWhatTheReferenceRefuses) {
  const ModelConfig c = odd_config();
  FlatModel<float> m(c);
  CpuModelOps ops;
  ModelRunner r(c, ops);
  Batch b = batch(0);
  EXPECT_THROW(r.embed_forward(m.unit_params(0).data()), zero3::InvalidArgument);  // no batch yet
  // Without checkpointing a layer's backward needs its forward of this batch.
  r.begin_batch(b.ids.data(), b.targets.data(), b.shape, false);
  EXPECT_THROW(r.layer_backward(1, m.unit_params(2).data(), m.unit_grads(2).data()), zero3::InvalidArgument);
  EXPECT_THROW(r.layer_forward(2, m.unit_params(2).data()), zero3::InvalidArgument);  // layer 2 of 2
  b.ids[3] = 17;
  EXPECT_THROW(r.begin_batch(b.ids.data(), b.targets.data(), b.shape, true), zero3::InvalidArgument);
  b = batch(0);
  b.targets[4] = -1;
  EXPECT_THROW(r.begin_batch(b.ids.data(), b.targets.data(), b.shape, true), zero3::InvalidArgument);
  EXPECT_THROW(r.begin_batch(b.ids.data(), b.targets.data(), BatchShape{0, 5}, true), zero3::InvalidArgument);

  // The LM head's weight: the head unit's when untied (no embedding buffers), the embedding's when tied.
  b = batch(0);
  r.begin_batch(b.ids.data(), b.targets.data(), b.shape, true);
  EXPECT_THROW(r.head_forward_backward(m.unit_params(3).data(), m.unit_grads(3).data(), {}, m.unit_params(0).data(),
                                       m.unit_grads(0).data()),
               zero3::InvalidArgument);
  EXPECT_THROW(r.head_forward_loss(m.unit_params(3).data(), {}, m.unit_params(0).data()), zero3::InvalidArgument);
  const ModelConfig tied = odd_config(true);
  FlatModel<float> t(tied);
  ModelRunner rt(tied, ops);
  rt.begin_batch(b.ids.data(), b.targets.data(), b.shape, true);
  EXPECT_THROW(rt.head_forward_backward(t.unit_params(3).data(), t.unit_grads(3).data(), {}), zero3::InvalidArgument);
  EXPECT_THROW(rt.head_forward_backward(t.unit_params(3).data(), t.unit_grads(3).data(), {}, t.unit_params(0).data()),
               zero3::InvalidArgument);  // gradients of the head but none for the LM head's weight
  EXPECT_THROW(rt.head_forward_loss(t.unit_params(3).data(), {}), zero3::InvalidArgument);
  EXPECT_NO_THROW(rt.head_forward_loss(t.unit_params(3).data(), {}, t.unit_params(0).data()));
}

// ---- EngineModel on the cpu device ----

zero3::Config one_step_config(bool bf16) {
  zero3::Config cfg;
  cfg.zero.stage = 3;
  cfg.bf16.enabled = bf16;
  cfg.communication_data_type = zero3::DType::f32;  // the gradients reach exp_avg unrounded
  cfg.train_micro_batch_size_per_gpu = 2;
  cfg.gradient_accumulation_steps = 1;
  cfg.gradient_clipping = 0.0;
  cfg.optimizer.present = true;
  cfg.optimizer.type = zero3::OptimizerType::adamw;
  cfg.optimizer.lr = 1e-3;
  cfg.optimizer.beta1 = 0.0;  // exp_avg after the first step = the gradient
  cfg.optimizer.weight_decay = 0.0;
  cfg.zero.param_persistence_threshold = 0;  // every unit gathered on use
  cfg.zero3.seed = 5;
  return cfg;
}

std::shared_ptr<zero3::Communicator> local_world() {
  zero3::CommOptions o;
  o.backend = "local";
  o.timeout = std::chrono::seconds(30);
  return std::shared_ptr<zero3::Communicator>(zero3::make_communicator(o, zero3::LaunchInfo{}, nullptr));
}

struct EngineCase {
  bool bf16;
  bool checkpointing;
  std::string name;
  bool tied = false;
};

void PrintTo(const EngineCase& c, std::ostream* os) { *os << c.name; }

class EngineModelOnCpu : public ::testing::TestWithParam<EngineCase> {};

// The gradient the engine received is read back through the public API: one AdamW step with beta1 = 0 leaves it
// in exp_avg (one rank, one micro-batch: the engine's average is the gradient itself).
TEST_P(EngineModelOnCpu, EqualsTheReferenceOnTheWeightsItComputesWith) {
  const EngineCase& ec = GetParam();
  const ModelConfig c = odd_config(ec.tied);
  auto device = zero3::make_cpu_device();
  const std::shared_ptr<zero3::Communicator> world = local_world();
  zero3::Engine engine(zero3::testing::resolved_for(one_step_config(ec.bf16), *world), world, *device);
  EngineModelOptions opt;
  opt.activation_checkpointing = ec.checkpointing;
  EngineModel model(engine, c, opt);
  engine.materialize();
  EXPECT_EQ(model.ops().name(), "cpu");
  EXPECT_EQ(model.ops().act(), zero3::DType::f32);

  FlatModel<float> ref(c);
  for (size_t u = 0; u < model.num_units(); ++u) {
    std::vector<float>& p = ref.unit_params(u);
    model.gather_unit(u, p.data());
    if (ec.bf16)
      for (float& x : p) x = zero3::bf16_to_f32(zero3::f32_to_bf16(x));  // what the scopes hold, widened
  }
  const Batch b = batch(1);
  ModelOptions mo;
  mo.activation_checkpointing = ec.checkpointing;
  // Tied: the engine adds the gradients of the embedding's two scopes (the head's share, then the embedding's),
  // so the reference keeps the head's share apart and adds it the same way.
  ModelView<float> grads = ref.grads();
  std::vector<float> head_share(static_cast<size_t>(ec.tied ? c.vocab_size * c.hidden_size : 0), 0.0f);
  if (ec.tied) grads.head.lm_head = head_share.data();
  const LossResult want =
      model_forward_backward(c, ref.params(), grads, b.ids.data(), b.targets.data(), nullptr, b.shape, mo);
  for (size_t i = 0; i < head_share.size(); ++i) ref.unit_grads(0)[i] = head_share[i] + ref.unit_grads(0)[i];
  // Evaluation: the same loss, forward scopes only.
  EXPECT_THROW(model.evaluate(b.ids.data(), b.targets.data(), b.shape), zero3::InvalidArgument);
  {
    zero3::EvalMode eval = engine.evaluate();
    const LossResult evaluated = model.evaluate(b.ids.data(), b.targets.data(), b.shape);
    EXPECT_EQ(evaluated.loss, want.loss);
    EXPECT_EQ(evaluated.count, want.count);
  }
  const LossResult have = model.forward_backward(b.ids.data(), b.targets.data(), b.shape);
  EXPECT_EQ(have.loss, want.loss);
  EXPECT_EQ(have.count, want.count);
  // The bf16 units widened into a staging buffer (tied: the embedding into a second one inside the head's scope).
  const int64_t staged = model.layouts()[1].numel + (ec.tied ? model.layouts()[0].numel : 0);
  EXPECT_EQ(model.activation_bytes(),
            runner_buffer_sizes(c, b.shape, ec.checkpointing, 4).total() + (ec.bf16 ? staged * 4 : 0));
  EXPECT_EQ(estimate_activations(c, b.shape, ec.checkpointing, zero3::DeviceType::cpu,
                                 ec.bf16 ? zero3::DType::bf16 : zero3::DType::f32)
                .unit_staging,
            ec.bf16 ? staged * 4 : 0);
  const zero3::StepResult r = engine.step();
  ASSERT_TRUE(r.applied);
  for (size_t u = 0; u < model.num_units(); ++u) {
    const zero3::ShardView shard = engine.local_shard(model.unit(u));
    ASSERT_GE(shard.length, model.layouts()[u].numel);
    std::vector<float> g(shard.exp_avg, shard.exp_avg + model.layouts()[u].numel);
    expect_same_bits(g, ref.unit_grads(u), "gradient of unit " + model.layouts()[u].name);
  }
}

INSTANTIATE_TEST_SUITE_P(Llama, EngineModelOnCpu,
                         ::testing::Values(EngineCase{false, true, "fp32_checkpointing"},
                                           EngineCase{false, false, "fp32_no_checkpointing"},
                                           EngineCase{true, true, "bf16_checkpointing"},
                                           EngineCase{false, true, "tied_fp32_checkpointing", true},
                                           EngineCase{false, false, "tied_fp32_no_checkpointing", true},
                                           EngineCase{true, true, "tied_bf16_checkpointing", true}),
                         [](const ::testing::TestParamInfo<EngineCase>& i) { return i.param.name; });

}  // namespace

// The Llama-3 layer, head and whole model over flat unit buffers: backward against finite differences in
// double, activation checkpointing, accumulation, float against double.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "grad_check.hpp"
#include "llama_model.hpp"
#include "zero3/error.hpp"

using namespace llama3;
using llama3::testing::dot;
using llama3::testing::expect_gradient;
using llama3::testing::max_rel_diff;
using llama3::testing::random_vector;

namespace {

// Odd shapes: hidden 12, 3 query heads sharing 1 kv head (head_dim 4), ffn 20, vocab 17.
ModelConfig odd_config(bool llama31_scaling = false) {
  ModelConfig c = parse_model_config(R"({"hidden_size": 12, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 3, "num_key_value_heads": 1, "vocab_size": 17, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-5, "initializer_range": 0.3})");
  if (llama31_scaling) {
    c.rope_theta = 2.0;  // fast rotations so every band of the scaling is crossed at small positions
    c.rope_scaling = RopeScaling{4.0, 1.0, 2.0, 8};
  }
  return c;
}

struct Batch {
  BatchShape shape{2, 5};
  std::vector<int32_t> ids{3, 16, 0, 7, 7, 1, 2, 3, 4, 5};
  std::vector<int32_t> targets{16, 0, kIgnoreIndex, 7, 1, 2, kIgnoreIndex, 4, 5, 9};
};

// Norm weights drawn around 1 (not exactly 1) so their gradients are exercised too.
template <typename T>
void randomize(FlatModel<T>& m, uint64_t seed) {
  m.init_random(seed);
  for (size_t u = 0; u < m.units().size(); ++u)
    for (const ParamSpec& p : m.units()[u].params)
      if (p.init == ParamInit::ones) {
        auto noise = random_vector<T>(p.numel, seed + u * 31 + p.offset, 0.3);
        for (int64_t i = 0; i < p.numel; ++i) m.unit_params(u)[p.offset + i] += noise[i];
      }
}

}  // namespace

TEST(Layer, BackwardMatchesFiniteDifferences) {
  for (bool scaled : {false, true}) {
    const ModelConfig c = odd_config(scaled);
    const BatchShape s{2, 5};
    const int64_t n = s.tokens(), hid = c.hidden_size;
    FlatModel<double> m(c);
    randomize(m, 100);
    std::vector<double>& w = m.unit_params(1);
    auto x = random_vector<double>(n * hid, 101), r = random_vector<double>(n * hid, 102);
    std::vector<int32_t> pos{0, 1, 2, 3, 4, 3, 9, 17, 30, 64};  // also positions no sequence would use
    auto rope = make_rope_table<double>(rope_inv_freq(c), pos.data(), n);
    LayerCache<double> cache;
    LayerWorkspace<double> ws;
    auto loss = [&] {
      std::vector<double> y(n * hid);
      layer_forward(c, layer_view(c, static_cast<const double*>(w.data())), x.data(), y.data(), s, rope, cache, ws);
      return dot(y, r);
    };
    std::vector<double> y(n * hid), dx(n * hid), dw(w.size(), 0.0);
    layer_forward(c, layer_view(c, static_cast<const double*>(w.data())), x.data(), y.data(), s, rope, cache, ws);
    layer_backward(c, layer_view(c, static_cast<const double*>(w.data())), x.data(), r.data(), dx.data(),
                   layer_view(c, dw.data()), s, rope, cache, ws, false);
    expect_gradient(x, dx, loss, scaled ? "scaled dx" : "dx");
    // Each parameter of the unit separately, so a failure names it.
    const UnitLayout& u = m.units()[1];
    for (const ParamSpec& p : u.params) {
      std::vector<double> sub(w.begin() + p.offset, w.begin() + p.offset + p.numel);
      std::vector<double> dsub(dw.begin() + p.offset, dw.begin() + p.offset + p.numel);
      auto sub_loss = [&] {
        std::copy(sub.begin(), sub.end(), w.begin() + p.offset);
        return loss();
      };
      expect_gradient(sub, dsub, sub_loss, p.name);
      std::copy(sub.begin(), sub.end(), w.begin() + p.offset);
    }
  }
}

TEST(Layer, BackwardWithoutForwardIsAnError) {
  const ModelConfig c = odd_config();
  const BatchShape s{1, 3};
  FlatModel<float> m(c);
  std::vector<float> x(3 * 12), dy(3 * 12), dx(3 * 12);
  auto pos = default_positions(s);
  auto rope = make_rope_table<float>(rope_inv_freq(c), pos.data(), 3);
  LayerCache<float> cache;
  LayerWorkspace<float> ws;
  EXPECT_THROW(layer_backward(c, layer_view(c, static_cast<const float*>(m.unit_params(1).data())), x.data(), dy.data(),
                              dx.data(), layer_view(c, m.unit_grads(1).data()), s, rope, cache, ws, false),
               zero3::InvalidArgument);
}

TEST(Model, BackwardMatchesFiniteDifferences) {
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<double> m(c);
  randomize(m, 200);
  auto loss = [&] { return model_loss(c, m.params(), b.ids.data(), b.targets.data(), nullptr, b.shape).loss; };
  LossResult r = model_forward_backward(c, m.params(), m.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  EXPECT_EQ(r.count, 8);
  EXPECT_NEAR(r.loss, loss(), 1e-13);
  EXPECT_NEAR(r.loss, r.loss_sum / 8, 1e-15);
  for (size_t u = 0; u < m.units().size(); ++u) {
    for (const ParamSpec& p : m.units()[u].params) {
      std::vector<double>& w = m.unit_params(u);
      std::vector<double> sub(w.begin() + p.offset, w.begin() + p.offset + p.numel);
      std::vector<double> dsub(m.unit_grads(u).begin() + p.offset, m.unit_grads(u).begin() + p.offset + p.numel);
      auto sub_loss = [&] {
        std::copy(sub.begin(), sub.end(), w.begin() + p.offset);
        return loss();
      };
      expect_gradient(sub, dsub, sub_loss, p.name, 1e-6, 1);
      std::copy(sub.begin(), sub.end(), w.begin() + p.offset);
    }
  }
}

TEST(Model, CheckpointingGivesIdenticalGradients) {
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<float> plain(c), ckpt(c);
  randomize(plain, 300);
  randomize(ckpt, 300);
  ModelOptions on;
  on.activation_checkpointing = true;
  LossResult a =
      model_forward_backward(c, plain.params(), plain.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  LossResult k =
      model_forward_backward(c, ckpt.params(), ckpt.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape, on);
  EXPECT_EQ(a.loss, k.loss);
  for (size_t u = 0; u < plain.units().size(); ++u) {
    ASSERT_EQ(plain.unit_grads(u).size(), ckpt.unit_grads(u).size());
    EXPECT_EQ(
        std::memcmp(plain.unit_grads(u).data(), ckpt.unit_grads(u).data(), plain.unit_grads(u).size() * sizeof(float)),
        0)
        << "unit " << plain.units()[u].name << " differs with checkpointing";
  }
}

TEST(Model, GradientsAccumulateAcrossCalls) {
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<double> m(c);
  randomize(m, 400);
  model_forward_backward(c, m.params(), m.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  std::vector<std::vector<double>> once;
  for (size_t u = 0; u < m.units().size(); ++u) once.push_back(m.unit_grads(u));
  model_forward_backward(c, m.params(), m.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  for (size_t u = 0; u < m.units().size(); ++u)
    for (size_t i = 0; i < once[u].size(); ++i) ASSERT_NEAR(m.unit_grads(u)[i], 2 * once[u][i], 1e-14);
  m.zero_grads();
  for (size_t u = 0; u < m.units().size(); ++u)
    for (double g : m.unit_grads(u)) ASSERT_EQ(g, 0.0);
}

TEST(Model, NormalizerScalesLossAndGradients) {
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<double> m1(c), m2(c);
  randomize(m1, 500);
  randomize(m2, 500);
  LossResult r1 = model_forward_backward(c, m1.params(), m1.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  ModelOptions opt;
  opt.loss.normalizer = 32;  // e.g. the tokens of a whole step over micro-batches and ranks
  opt.loss.chunk_rows = 3;
  LossResult r2 =
      model_forward_backward(c, m2.params(), m2.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape, opt);
  EXPECT_NEAR(r2.loss * 32, r1.loss * 8, 1e-12);
  for (size_t u = 0; u < m1.units().size(); ++u)
    for (size_t i = 0; i < m1.unit_grads(u).size(); ++i)
      ASSERT_NEAR(m2.unit_grads(u)[i] * 32, m1.unit_grads(u)[i] * 8, 1e-12);

  // No target at all: zero loss, no gradient.
  std::vector<int32_t> none(b.targets.size(), kIgnoreIndex);
  m1.zero_grads();
  LossResult r0 = model_forward_backward(c, m1.params(), m1.grads(), b.ids.data(), none.data(), nullptr, b.shape);
  EXPECT_EQ(r0.loss, 0.0);
  EXPECT_EQ(r0.count, 0);
  for (size_t u = 0; u < m1.units().size(); ++u)
    for (double g : m1.unit_grads(u)) ASSERT_EQ(g, 0.0);
}

TEST(Model, ShiftingAllPositionsLeavesTheLossUnchanged) {
  // RoPE makes attention depend only on relative positions. Exactly so in real arithmetic; here the angles are
  // float32 products (as in transformers), which moves the loss by about 1e-9.
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<double> m(c);
  randomize(m, 600);
  auto pos = default_positions(b.shape);
  for (auto& p : pos) p += 37;
  double base = model_loss(c, m.params(), b.ids.data(), b.targets.data(), nullptr, b.shape).loss;
  double shifted = model_loss(c, m.params(), b.ids.data(), b.targets.data(), pos.data(), b.shape).loss;
  EXPECT_NEAR(base, shifted, 1e-7);
  // but not when the positions within a sequence change
  std::swap(pos[0], pos[1]);
  EXPECT_GT(std::fabs(model_loss(c, m.params(), b.ids.data(), b.targets.data(), pos.data(), b.shape).loss - base),
            1e-4);
}

TEST(Model, FloatAgreesWithDouble) {
  const ModelConfig c = odd_config();
  Batch b;
  FlatModel<double> md(c);
  FlatModel<float> mf(c);
  randomize(md, 700);
  for (size_t u = 0; u < md.units().size(); ++u)
    for (size_t i = 0; i < md.unit_params(u).size(); ++i) {
      mf.unit_params(u)[i] = static_cast<float>(md.unit_params(u)[i]);
      md.unit_params(u)[i] = mf.unit_params(u)[i];  // the same (float) weights
    }
  LossResult rd = model_forward_backward(c, md.params(), md.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  LossResult rf = model_forward_backward(c, mf.params(), mf.grads(), b.ids.data(), b.targets.data(), nullptr, b.shape);
  EXPECT_NEAR(rf.loss, rd.loss, 1e-6 * rd.loss);
  for (size_t u = 0; u < md.units().size(); ++u)
    EXPECT_LT(max_rel_diff(mf.unit_grads(u).data(), md.unit_grads(u).data(), md.unit_grads(u).size()), 1e-5)
        << md.units()[u].name;
  // logits too
  std::vector<double> ld(b.shape.tokens() * c.vocab_size);
  std::vector<float> lf(ld.size());
  model_logits(c, md.params(), b.ids.data(), nullptr, b.shape, ld.data());
  model_logits(c, mf.params(), b.ids.data(), nullptr, b.shape, lf.data());
  EXPECT_LT(max_rel_diff(lf.data(), ld.data(), ld.size()), 1e-6);
}

TEST(Model, ParameterLookupByHuggingFaceName) {
  const ModelConfig c = odd_config();
  FlatModel<float> m(c);
  EXPECT_EQ(m.param("model.embed_tokens.weight"), m.unit_params(0).data());
  EXPECT_EQ(m.param("model.layers.1.self_attn.k_proj.weight"), m.unit_params(2).data() + 12 + 12 * 12);
  EXPECT_EQ(m.param("lm_head.weight"), m.unit_params(3).data() + 12);
  EXPECT_EQ(m.grad("model.norm.weight"), m.unit_grads(3).data());
  EXPECT_THROW(m.param("model.layers.2.mlp.up_proj.weight"), zero3::InvalidArgument);
  // views agree with the layout
  auto v = m.params();
  EXPECT_EQ(v.layers[1].down_proj, m.param("model.layers.1.mlp.down_proj.weight"));
  EXPECT_EQ(v.layers[0].post_attention_layernorm, m.param("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_EQ(v.head.lm_head, m.param("lm_head.weight"));
}

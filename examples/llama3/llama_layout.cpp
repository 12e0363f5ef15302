#include "llama_layout.hpp"

#include "zero3/error.hpp"

namespace llama3 {
namespace {

void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, ParamInit init, double std) {
  ParamSpec p;
  p.name = std::move(name);
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  p.shape = std::move(shape);
  p.offset = u.numel;
  p.init = init;
  p.init_std = init == ParamInit::normal ? std : 0.0;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

}  // namespace

const ParamSpec& UnitLayout::param(const std::string& pname) const {
  for (const ParamSpec& p : params)
    if (p.name == pname) return p;
  throw zero3::InvalidArgument("unit " + name + " has no parameter " + pname);
}

UnitLayout embedding_unit_layout(const ModelConfig& c) {
  UnitLayout u;
  u.name = "embedding";
  u.kind = UnitKind::embedding;
  add(u, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, ParamInit::normal, c.initializer_range);
  return u;
}

UnitLayout layer_unit_layout(const ModelConfig& c, int64_t layer) {
  if (layer < 0 || layer >= c.num_hidden_layers) {
    throw zero3::InvalidArgument("layer " + std::to_string(layer) + " outside [0, " +
                                 std::to_string(c.num_hidden_layers) + ")");
  }
  UnitLayout u;
  u.name = "layers." + std::to_string(layer);
  u.kind = UnitKind::layer;
  u.layer = layer;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const double sd = c.initializer_range;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  add(u, p + "input_layernorm.weight", {h}, ParamInit::ones, 0);
  add(u, p + "self_attn.q_proj.weight", {c.q_dim(), h}, ParamInit::normal, sd);
  add(u, p + "self_attn.k_proj.weight", {c.kv_dim(), h}, ParamInit::normal, sd);
  add(u, p + "self_attn.v_proj.weight", {c.kv_dim(), h}, ParamInit::normal, sd);
  add(u, p + "self_attn.o_proj.weight", {h, c.q_dim()}, ParamInit::normal, sd);
  add(u, p + "post_attention_layernorm.weight", {h}, ParamInit::ones, 0);
  add(u, p + "mlp.gate_proj.weight", {inter, h}, ParamInit::normal, sd);
  add(u, p + "mlp.up_proj.weight", {inter, h}, ParamInit::normal, sd);
  add(u, p + "mlp.down_proj.weight", {h, inter}, ParamInit::normal, sd);
  return u;
}

UnitLayout head_unit_layout(const ModelConfig& c) {
  UnitLayout u;
  u.name = "head";
  u.kind = UnitKind::head;
  add(u, "model.norm.weight", {c.hidden_size}, ParamInit::ones, 0);
  if (!c.tie_word_embeddings) {
    add(u, "lm_head.weight", {c.vocab_size, c.hidden_size}, ParamInit::normal, c.initializer_range);
  }
  return u;
}

std::vector<UnitLayout> model_unit_layouts(const ModelConfig& c) {
  std::vector<UnitLayout> units;
  units.reserve(static_cast<size_t>(c.num_hidden_layers + 2));
  units.push_back(embedding_unit_layout(c));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) units.push_back(layer_unit_layout(c, i));
  units.push_back(head_unit_layout(c));
  return units;
}

int64_t unit_of_param(const ModelConfig& c, const std::string& name) {
  if (name == "model.embed_tokens.weight") return 0;
  if (name == "model.norm.weight") return c.num_hidden_layers + 1;
  if (name == "lm_head.weight") return c.tie_word_embeddings ? -1 : c.num_hidden_layers + 1;
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t end = name.find('.', prefix.size());
  if (end == std::string::npos || end == prefix.size()) return -1;
  int64_t layer = 0;
  for (size_t i = prefix.size(); i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
    if (layer >= c.num_hidden_layers) return -1;
  }
  const UnitLayout u = layer_unit_layout(c, layer);
  for (const ParamSpec& p : u.params)
    if (p.name == name) return 1 + layer;
  return -1;
}

}  // namespace llama3

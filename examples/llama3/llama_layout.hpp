// How the Llama-3 parameters are grouped into zero3 units and laid out in each unit's flat buffer.
//
// Units, in the order the forward pass uses them (unit index in parentheses):
//   (0)       embedding:  model.embed_tokens.weight                          (vocab, hidden)
//   (1 + i)   layer i:    model.layers.i.input_layernorm.weight              (hidden)
//                         model.layers.i.self_attn.q_proj.weight             (n_heads*head_dim, hidden)
//                         model.layers.i.self_attn.k_proj.weight             (n_kv_heads*head_dim, hidden)
//                         model.layers.i.self_attn.v_proj.weight             (n_kv_heads*head_dim, hidden)
//                         model.layers.i.self_attn.o_proj.weight             (hidden, n_heads*head_dim)
//                         model.layers.i.post_attention_layernorm.weight     (hidden)
//                         model.layers.i.mlp.gate_proj.weight                (intermediate, hidden)
//                         model.layers.i.mlp.up_proj.weight                  (intermediate, hidden)
//                         model.layers.i.mlp.down_proj.weight                (hidden, intermediate)
//   (1 + L)   head:       model.norm.weight                                  (hidden)
//                         lm_head.weight                                     (vocab, hidden)   untied only
//
// Within a unit the parameters are packed back to back in exactly this order, row-major, no padding (offsets
// in elements). A unit's gradient buffer has the same layout. q/k/v being adjacent lets one GEMM compute all
// three projections, and gate/up likewise. Names are Hugging Face's, so safetensors files map one to one.
//
// Tied embeddings (tie_word_embeddings = true: Llama-3.2-1B/3B, SmolLM2): the LM head multiplies by
// model.embed_tokens.weight, so there is no lm_head.weight anywhere: the head unit holds only model.norm.weight,
// and the head's computation enters the embedding unit too (EngineModel nests its scope in the head's), whose
// gradient is then the sum of the embedding's and the head's. Hugging Face's checkpoints of tied models store
// model.embed_tokens.weight only, as this layout does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_config.hpp"

namespace llama3 {

// How a parameter starts when the model is built from its config (Hugging Face's _init_weights):
// weights normal(0, initializer_range), RMSNorm weights 1.
enum class ParamInit { normal, ones };

struct ParamSpec {
  std::string name;            // Hugging Face name
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  ParamInit init = ParamInit::normal;
  double init_std = 0;  // for ParamInit::normal
};

enum class UnitKind { embedding, layer, head };

struct UnitLayout {
  std::string name;  // "embedding", "layers.3", "head"
  UnitKind kind = UnitKind::embedding;
  int64_t layer = -1;  // for UnitKind::layer
  std::vector<ParamSpec> params;
  int64_t numel = 0;  // sum of params' numel

  // Throws zero3::InvalidArgument naming the unit when `name` is not one of its parameters.
  const ParamSpec& param(const std::string& name) const;
};

// Index of each parameter inside a layer unit's `params`, in layout order.
enum LayerParam : int {
  kInputLayernorm = 0,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kPostAttentionLayernorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kLayerParamCount
};

UnitLayout embedding_unit_layout(const ModelConfig& config);
UnitLayout layer_unit_layout(const ModelConfig& config, int64_t layer);
UnitLayout head_unit_layout(const ModelConfig& config);

// All units: embedding, layers 0..L-1, head (L + 2 units).
std::vector<UnitLayout> model_unit_layouts(const ModelConfig& config);

// The unit index (into model_unit_layouts) of a Hugging Face parameter name, or -1 when it is not one (as
// lm_head.weight with tied embeddings).
int64_t unit_of_param(const ModelConfig& config, const std::string& name);

}  // namespace llama3

// The Llama-3 model dimensions, read from a Hugging Face config.json (LlamaConfig).
//
// Both spellings of the rotary settings are accepted: the published Meta-Llama-3 files (top-level
// "rope_theta" and an optional "rope_scaling" object, Llama-3.1 style) and the newer "rope_parameters"
// object that recent transformers releases write. Keys this model does not use (architectures,
// bos_token_id, torch_dtype, ...) are ignored; keys that would change the architecture into something this
// code does not compute (attention_bias, mlp_bias, hidden_act other than silu, pretraining_tp > 1) are
// refused. Every failure is a zero3::ConfigError whose message names the file and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "zero3/memory_plan.hpp"

namespace llama3 {

// Llama-3.1 frequency-dependent RoPE scaling ("rope_type": "llama3").
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads when absent, as in LlamaConfig
  int64_t vocab_size = 0;
  int64_t head_dim = 0;  // "head_dim" when present, else hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // absent: plain RoPE
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int64_t group_size() const { return num_attention_heads / num_key_value_heads; }
  // Parameters of the whole model (with tied embeddings the embedding matrix counts once).
  int64_t num_parameters() const;
};

// Parses the text of a config.json. `source` names it in error messages (a path, or "<string>").
ModelConfig parse_model_config(const std::string& json_text, const std::string& source = "<string>");

// The config.json to write beside exported weights of dtype `torch_dtype` ("float32", "bfloat16"): `json_text`
// (keys, values and their order kept; comments dropped) with its "torch_dtype" and "dtype" keys, those it has, set
// to it; with neither, "torch_dtype" is added (transformers 5 writes "dtype" and reads both, warning that
// "torch_dtype" is deprecated; transformers 4 reads "torch_dtype"). Throws zero3::ConfigError naming `source`
// for text that is not a JSON object.
std::string exported_config_json(const std::string& json_text, const std::string& torch_dtype,
                                 const std::string& source = "<string>");

// Writes exported_config_json(json_text, torch_dtype, "the model config") as DIR/config.json. Throws zero3::IoError
// when it cannot be written.
void write_exported_config(const std::filesystem::path& dir, const std::string& json_text,
                           const std::string& torch_dtype);

// Reads and parses a config.json file. Throws zero3::IoError when the file cannot be read.
ModelConfig load_model_config(const std::string& path);

// Throws zero3::ConfigError when the dimensions are inconsistent (heads not dividing, odd head_dim, ...).
// parse_model_config calls it; call it again after editing a config by hand.
void validate(const ModelConfig& config, const std::string& source = "<config>");

// The dimensions zero3's plans take (zero3::LlamaDims: the memory plan's units, the activation estimate, the
// step-time model's FLOPs).
zero3::LlamaDims llama_dims(const ModelConfig& config);

// One line for logs: "hidden 4096, 32 layers, 32 heads (8 kv, head_dim 128), ffn 14336, vocab 128256, 8.03B params".
std::string describe(const ModelConfig& config);

}  // namespace llama3

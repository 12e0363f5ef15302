// The Hugging Face golden fixtures (tools/make_golden.py, committed under tests/golden/) as the tests read them:
// the model config, the batch (ids, labels, and the targets LlamaForCausalLM's loss uses: position t predicts
// labels[t + 1], the last position of each sequence nothing), the reference logits and loss, and readers of
// the weights and gradients files. Fixtures: "" (tests/golden itself: the tiny Llama, untied), "tied" (the same
// with tied embeddings), "vocab32k" (vocabulary 32768, tied, peaked rows; no logits, a float64 loss).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "llama_model.hpp"
#include "model_config.hpp"
#include "ops/cross_entropy.hpp"
#include "zero3/safetensors.hpp"

namespace llama3::testing {

// LLAMA3_GOLDEN_DIR, else $ZERO3_SOURCE_DIR/examples/llama3/tests/golden, else the source tree's.
inline std::filesystem::path golden_dir() {
  if (const char* d = std::getenv("LLAMA3_GOLDEN_DIR")) return d;
  if (const char* s = std::getenv("ZERO3_SOURCE_DIR")) {
    return std::filesystem::path(s) / "examples/llama3/tests/golden";
  }
  return std::filesystem::path(LLAMA3_SOURCE_DIR) / "tests/golden";
}

// A whole tensor of a fixture file; its byte size must match T.
template <typename T>
std::vector<T> read_all(const zero3::safetensors::SafetensorsReader& r, const std::string& name) {
  const zero3::safetensors::TensorInfo& info = r.tensor(name);
  std::vector<T> v(static_cast<size_t>(info.numel()));
  EXPECT_EQ(info.nbytes(), v.size() * sizeof(T)) << name;
  r.read_range(name, 0, info.numel(), v.data());
  return v;
}

struct GoldenFixture {
  std::filesystem::path dir;
  ModelConfig config;
  BatchShape shape;
  std::vector<int32_t> ids, labels, targets;  // (batch, seq)
  std::vector<float> logits;                  // (batch, seq, vocab); empty when the fixture has none
  double loss = 0;                            // transformers' (float32)
  double loss_f64 = 0;                        // the same in float64 throughout; 0 when the fixture has none
  std::unique_ptr<zero3::safetensors::SafetensorsReader> batch, grads;

  explicit GoldenFixture(const std::string& name = "") : dir(golden_dir() / name) {
    config = load_model_config((dir / "config.json").string());
    batch = std::make_unique<zero3::safetensors::SafetensorsReader>(dir / "batch.safetensors");
    grads = std::make_unique<zero3::safetensors::SafetensorsReader>(dir / "grads.safetensors");
    const auto& shp = batch->tensor("input_ids").shape;
    shape = {shp.at(0), shp.at(1)};
    ids = read_all<int32_t>(*batch, "input_ids");
    labels = read_all<int32_t>(*batch, "labels");
    if (batch->find("logits") != nullptr) logits = read_all<float>(*batch, "logits");
    loss = read_all<double>(*batch, "loss").at(0);
    if (batch->find("loss_f64") != nullptr) loss_f64 = read_all<double>(*batch, "loss_f64").at(0);
    targets.assign(ids.size(), kIgnoreIndex);
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t t = 0; t + 1 < shape.seq; ++t) targets[b * shape.seq + t] = labels[b * shape.seq + t + 1];
  }

  std::filesystem::path weights() const { return dir / "model.safetensors"; }
};

}  // namespace llama3::testing

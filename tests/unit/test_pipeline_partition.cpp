// Cutting layers into stages (src/pipeline/layer_partition.hpp) by each of DeepSpeed's methods on a Llama-shaped
// model, against cuts worked out by hand, and the inputs that cannot be cut, named with their keys and numbers.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/layer_partition.hpp"
#include "zero3/error.hpp"

namespace zero3::pipeline {
namespace {

// embedding (large), 6 decoder layers, final norm (tiny), head (large).
std::vector<LayerInfo> llama_like() {
  std::vector<LayerInfo> l = {{"embedding", 4000}};
  for (int i = 0; i < 6; ++i) l.push_back({"layers." + std::to_string(i) + ".DecoderLayer", 1000});
  l.push_back({"norm", 10});
  l.push_back({"head", 4000});
  return l;
}

std::string error_of(const std::vector<LayerInfo>& layers, int stages, const std::string& method) {
  try {
    partition_layers(layers, stages, method);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LayerPartition, UniformGivesTheFirstStagesTheExtraLayers) {
  EXPECT_EQ(partition_layers(llama_like(), 4, "uniform"), (std::vector<int>{0, 3, 5, 7, 9}));  // 9 = 3+2+2+2
  EXPECT_EQ(partition_layers(llama_like(), 9, "uniform"), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(LayerPartition, ParametersMakeTheLargestStageAsSmallAsItCanBe) {
  const auto layers = llama_like();
  // Total 14010; the embedding and the head (4000 each) bound it below. Two stages: 7000 | 7010.
  EXPECT_EQ(partition_layers(layers, 2, "parameters"), (std::vector<int>{0, 4, 9}));
  // Four stages: embedding | 4 layers | 2 layers + norm | head: the largest is 4000.
  const auto four = partition_layers(layers, 4, "parameters");
  EXPECT_EQ(four, (std::vector<int>{0, 1, 5, 8, 9}));
  EXPECT_EQ(describe_partition(layers, four),
            "stage 0: embedding (1 layer, 4000 parameters); stage 1: layers.0.DecoderLayer .. layers.3.DecoderLayer "
            "(4 layers, 4000 parameters); stage 2: layers.4.DecoderLayer .. norm (3 layers, 2010 parameters); stage "
            "3: head (1 layer, 4000 parameters)");
}

TEST(LayerPartition, TypeRegexBalancesTheMatchingLayers) {
  // 6 decoder layers over 3 stages: 2 each; the embedding rides with the first, norm and head with the last.
  EXPECT_EQ(partition_layers(llama_like(), 3, "type:decoderlayer"), (std::vector<int>{0, 3, 5, 9}));
  EXPECT_EQ(partition_layers(llama_like(), 2, "type:^layers\\."), (std::vector<int>{0, 4, 9}));
}

TEST(LayerPartition, InputsThatCannotBeCutAreNamed) {
  EXPECT_EQ(error_of(llama_like(), 10, "uniform"),
            "pipeline.stages: 10 stages for 9 layers; every stage needs at least one layer");
  EXPECT_EQ(error_of(llama_like(), 2, "type:Attention"),
            "pipeline.partition: \"type:Attention\" matches none of the layers (embedding, layers.0.DecoderLayer, "
            "layers.1.DecoderLayer, layers.2.DecoderLayer, layers.3.DecoderLayer, layers.4.DecoderLayer, ... (9 "
            "layers))");
  EXPECT_NE(error_of(llama_like(), 2, "type:[")
                .find("pipeline.partition: \"type:[\": the regular expression does "
                      "not compile"),
            std::string::npos);
  EXPECT_EQ(error_of(llama_like(), 2, "best"),
            "pipeline.partition: \"best\"; expected \"parameters\", \"uniform\" or \"type:REGEX\"");
  EXPECT_EQ(error_of(llama_like(), 0, "uniform"), "pipeline.stages: 0; expected at least 1");
}

}  // namespace
}  // namespace zero3::pipeline

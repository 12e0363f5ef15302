// Cutting a model's layers into pipeline stages, as DeepSpeed's PipelineModule does (its partition_method, the
// config's pipeline.partition): every stage gets a contiguous run of at least one layer.
//   "uniform"     layer counts as even as possible; the first (layers % stages) stages get one more
//   "parameters"  the largest stage's parameter count as small as it can be
//   "type:REGEX"  the largest stage's count of layers whose name matches REGEX (ECMAScript, case-insensitive,
//                 anywhere in the name, as Python's re.search with IGNORECASE) as small as it can be: put the
//                 transformer blocks' pattern here and the embedding and head ride along
// Where several cuts reach the same largest stage, the earlier stages take as many layers as they can (DeepSpeed's
// own search may pick another of the equally good cuts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero3::pipeline {

struct LayerInfo {
  std::string name;        // "embedding", "layers.3", "head"
  int64_t parameters = 0;  // elements
};

// The stage boundaries: stage s holds layers [bounds[s], bounds[s + 1]); bounds has stages + 1 entries, bounds[0] = 0
// and bounds[stages] = layers.size(). Throws ConfigError naming the key and the numbers: more stages than layers
// (pipeline.stages), a method that is none of the above or a regex that does not compile or matches no layer
// (pipeline.partition), a negative parameter count.
std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method);

// "stage 0: embedding .. layers.3 (4 layers, 1234 parameters); stage 1: ..."
std::string describe_partition(const std::vector<LayerInfo>& layers, const std::vector<int>& bounds);

}  // namespace zero3::pipeline

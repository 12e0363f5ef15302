#include "zero/resolved_config.hpp"

#include <string>
#include <vector>

#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string source_of(const Config& c) { return c.source.empty() ? "built in the program" : "from " + c.source; }

}  // namespace

void require_resolved(const Config& c, int world, bool pipeline_stage) {
  if (!c.resolved) {
    // What resolve() would have filled in: the "auto" keys, and the batch sizes DeepSpeed infers from the others
    // and the world size.
    std::vector<std::string> batch;
    if (!c.train_batch_size) batch.push_back("train_batch_size");
    if (!c.train_micro_batch_size_per_gpu) batch.push_back("train_micro_batch_size_per_gpu");
    if (!c.gradient_accumulation_steps) batch.push_back("gradient_accumulation_steps");
    std::string missing;
    if (!c.auto_keys.empty()) missing += "; still \"auto\": " + joined(c.auto_keys);
    if (!batch.empty()) missing += "; batch sizes not inferred: " + joined(batch);
    if (missing.empty()) missing = "; it also checks the batch sizes against the world size and the rules across keys";
    throw ConfigError(log::concat("Engine: the config (", source_of(c), ") was never resolved", missing,
                                  ". Call zero3::resolve(config, {.world_size = comm->size(), ...}) before creating "
                                  "the Engine, or create it with zero3::initialize(), which does"));
  }
  const auto& tb = c.train_batch_size;
  const auto& mb = c.train_micro_batch_size_per_gpu;
  const auto& ga = c.gradient_accumulation_steps;
  if (!tb || !mb || !ga) {
    throw ConfigError(log::concat("Engine: the config (", source_of(c), ") lost ",
                                  !tb   ? "train_batch_size"
                                  : !mb ? "train_micro_batch_size_per_gpu"
                                        : "gradient_accumulation_steps",
                                  " after resolve(); resolve it again"));
  }
  // A pipelined config divides the world among its stages: refused before the batch check would blame the batch.
  if (!pipeline_stage && c.pipeline.stages.value_or(1) > 1) {
    throw InvalidArgument(log::concat(
        "Engine: pipeline.stages = ", *c.pipeline.stages, " (config ", source_of(c),
        "): a pipelined config runs on a zero3::PipelineEngine (zero3/pipeline_engine.hpp), which makes each "
        "stage's Engine over its data-parallel group; an Engine over the whole world cannot hold a stage"));
  }
  if (*mb < 1 || *ga < 1 || *tb != *mb * *ga * world) {
    throw ConfigError(log::concat("train_batch_size: ", *tb, " is not train_micro_batch_size_per_gpu ", *mb,
                                  " x gradient_accumulation_steps ", *ga, " x the communicator's world size ", world,
                                  " = ", *mb * *ga * world, " (config ", source_of(c),
                                  "); was it resolved for another world size? Pass ResolveInputs::world_size = ",
                                  "comm->size() to zero3::resolve"));
  }
}

}  // namespace zero3::detail

// save_checkpoint and load_checkpoint of a PipelineEngine (zero3/pipeline_checkpoint.hpp): the checkpoint code's save
// and load over the pipeline's world, each rank with its stage engine.
#include "zero3/pipeline_checkpoint.hpp"

#include "checkpoint/checkpoint_ranks.hpp"
#include "checkpoint/save_on_node.hpp"

namespace zero3 {
namespace {

ckpt::CheckpointRanks ranks_of(PipelineEngine& pipeline) {
  return ckpt::pipeline_ranks(pipeline.engine(), pipeline.world(), pipeline.pipeline_rank(), pipeline.pipeline_size());
}

}  // namespace

SavedCheckpoint save_checkpoint(PipelineEngine& pipeline, const std::filesystem::path& dir, const std::string& tag,
                                const CheckpointExtras& extras) {
  return ckpt::save_checkpoint_on_node(ranks_of(pipeline), dir, tag, extras, ckpt::host_name());
}

LoadedCheckpoint load_checkpoint(PipelineEngine& pipeline, const std::filesystem::path& dir, const std::string& tag) {
  return ckpt::load_checkpoint_on(ranks_of(pipeline), dir, tag);
}

}  // namespace zero3

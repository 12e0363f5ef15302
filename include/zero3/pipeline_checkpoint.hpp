// Checkpoints of a pipelined run (docs/checkpoints.md, "Pipelined runs"): one checkpoint directory for the whole
// pipeline, by unit names, that resumes with another number of stages, on a single Engine, and consolidates to Hugging
// Face safetensors as any checkpoint does.
//
//   zero3::PipelineEngine pipe(config, world, device, layers, model);
//   if (zero3::checkpoint_exists(dir)) {
//     zero3::LoadedCheckpoint r = zero3::load_checkpoint(pipe, dir);   // any checkpoint of the same model
//     sampler.seek(r.extra_int("samples_seen"));
//   }
//   for (...) {
//     zero3::PipelineStepResult r = pipe.train_batch();
//     if (pipe.global_steps() % 1000 == 0)
//       zero3::save_checkpoint(pipe, dir, "global_step" + std::to_string(pipe.global_steps()),
//                              {{"samples_seen", std::to_string(sampler.position())}});
//   }
//
// Layout. Every stage's data-parallel ranks write their slices of the stage's units as a plain checkpoint's ranks do,
// into files named after the stage and the rank within the stage
// (DIR/TAG/stage-01-of-04-rank-00000-of-00002.safetensors); one manifest lists every unit of the model (stage by stage, each stage's units in the order its engine
// declared them, with the stage that held it) and every file. Its format_version is 2 (its "pipeline" section: stages
// and data-parallel size); a checkpoint of one Engine stays version 1.
//
// Loading. Each stage engine's units are found by name among the checkpoint's, whichever stage (or Engine) saved them,
// and each rank reads the byte ranges covering its new slices: a checkpoint saved at 4 stages loads at 2 stages, at 1,
// or on an Engine without a pipeline (load_checkpoint(Engine&) of checkpoint.hpp), and a checkpoint of an Engine loads
// into a pipeline. The stages together must hold exactly the checkpoint's units: a unit a stage declares that the
// checkpoint lacks, a unit of another shape or dtype, or a checkpoint unit that no stage holds is a CheckpointError on
// every rank, naming the unit.
//
// Step counts. A stage engine runs the micro-batches of an optimizer step in one micro-step, an unpipelined engine in
// gradient_accumulation_steps micro-steps: the checkpoint's training_state.micro_steps is what an unpipelined engine
// with the saving run's config counts (global steps x gradient_accumulation_steps), and each load converts it into
// the loading engine's own count (docs/checkpoints.md). The data index of PipelineCall continues from the restored
// global steps.
//
// Collectives: both functions are collective over the pipeline's world (every rank calls them, with the same arguments,
// between train_batch() calls); on failure every rank throws. Model buffers (Engine::set_buffer_source) are not saved
// from a pipeline: a save whose stage engines list buffers is a CheckpointError naming the stage.
#pragma once

#include <filesystem>
#include <string>

#include "zero3/checkpoint.hpp"
#include "zero3/pipeline_engine.hpp"

namespace zero3 {

// Saves the pipeline's state (every stage's units, the counters, `extras`) as DIR/TAG and points DIR/latest at it, with
// the guarantees and errors of save_checkpoint(Engine&, ...).
SavedCheckpoint save_checkpoint(PipelineEngine& pipeline, const std::filesystem::path& dir, const std::string& tag,
                                const CheckpointExtras& extras = {});

// Restores DIR/TAG ("latest": the tag DIR/latest names) into every stage engine of the pipeline: a pipelined run's
// checkpoint at any number of stages and data-parallel ranks, or an Engine's.
LoadedCheckpoint load_checkpoint(PipelineEngine& pipeline, const std::filesystem::path& dir,
                                 const std::string& tag = "latest");

}  // namespace zero3

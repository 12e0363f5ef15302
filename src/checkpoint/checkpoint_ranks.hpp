// Who takes part in a save or a load, and with which engine. A checkpoint of one Engine: the engine's ranks. A
// pipelined run's: every rank of the pipeline, each saving or loading the units of its own stage's engine (whose
// communicator is the stage's data-parallel group), agreeing over a communicator of all of them.
#pragma once

#include <filesystem>
#include <string>

#include "zero3/checkpoint.hpp"
#include "zero3/comm.hpp"
#include "zero3/engine.hpp"

namespace zero3::ckpt {

struct CheckpointRanks {
  Engine& engine;           // this rank's engine
  Communicator& comm;       // every rank of the save or load: the engine's communicator, or the pipeline's world
  int pipeline_stage = 0;   // the pipeline stage of this rank's engine (its rank in its pipeline group)
  int pipeline_stages = 1;  // 1: one Engine, not a pipeline

  bool pipelined() const { return pipeline_stages > 1; }
};

// The ranks of one Engine.
inline CheckpointRanks engine_ranks(Engine& engine) { return {engine, engine.communicator(), 0, 1}; }

// The ranks of a pipeline: `world` holds every stage's ranks, `engine` is this rank's stage engine. Waits for the
// collectives the engine queued on its own communicator (Engine::communicator()), so that the world's collectives
// are issued after them on every rank.
inline CheckpointRanks pipeline_ranks(Engine& engine, Communicator& world, int pipeline_stage, int pipeline_stages) {
  (void)engine.communicator();
  return {engine, world, pipeline_stage, pipeline_stages};
}

// load_checkpoint for any ranks: each loads its engine's units, found by name among the checkpoint's (a pipeline
// stage's engine holds a part of them; together the stages must hold every unit).
LoadedCheckpoint load_checkpoint_on(const CheckpointRanks& ranks, const std::filesystem::path& dir,
                                    const std::string& tag);

// A checkpoint counts micro-steps in micro-batches, as an unpipelined engine does (gradient_accumulation_steps of
// them per optimizer step). A pipeline stage's engine runs every micro-batch of a step in one micro-step (its
// gradient_accumulation_steps() is 1, its config's gradient_accumulation_steps the micro-batches), so its count is
// scaled by the micro-batches on save and divided by them on load.
int64_t micro_batches_per_micro_step(const Engine& engine);
// The engine's counters as a checkpoint stores them.
TrainingState saved_training_state(const Engine& engine);
// A checkpoint's counters as `engine` counts them. When the saving run had another gradient_accumulation_steps
// (another data-parallel size), the micro-steps restart at global_steps x the engine's
// gradient_accumulation_steps() (logged).
TrainingState engine_training_state(const CheckpointInfo& info, const Engine& engine);

}  // namespace zero3::ckpt

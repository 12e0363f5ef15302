// A pipelined run's manifest, merged from what every rank says of its part of the save: the units of its stage's
// engine (each stage's first data-parallel rank), the ranges its shard file holds, its counters. Every rank gathers
// every piece (exchange_texts) and merges them alike, so a bad piece fails every rank the same way, before any shard
// file is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero3/checkpoint.hpp"

namespace zero3::ckpt {

struct NamedRange {
  std::string unit;
  int64_t begin = 0;
  int64_t length = 0;
};

struct StagePiece {
  int pipeline_stage = 0;
  int stage_rank = 0;                 // in the stage's data-parallel group
  std::string error;                  // what went wrong on the rank while it described its part ("" if nothing)
  std::string training_state;         // training_state_metadata() of its engine's counters, as saved
  int64_t buffers = 0;                // model buffers its engine lists (Engine::buffers)
  std::vector<NamedRange> ranges;     // what its shard file holds (none: it writes no file)
  std::vector<CheckpointUnit> units;  // its stage's units: stage rank 0 only
};

std::string piece_to_json(const StagePiece& piece);
// `rank` (the world rank that sent it) names it in errors.
StagePiece piece_from_json(const std::string& text, int rank);

// The units (stage by stage, each in its engine's order, with their pipeline_stage) and the files (by stage, then
// rank; bytes and CRC-32C not known yet) of a pipelined checkpoint, and the world rank writing each file.
struct PipelineLayout {
  std::vector<CheckpointUnit> units;
  std::vector<CheckpointFile> files;
  std::vector<int> file_ranks;
};

// `pieces` indexed by world rank. Throws CheckpointError naming the rank or stage: a rank's error, counters that
// differ between stages, a unit name in two stages, model buffers (not saved for pipelined runs), a range of a unit
// its stage does not hold, a stage or stage rank that is not exactly once in the world.
PipelineLayout merge_pieces(const std::vector<StagePiece>& pieces, int stages, int data_parallel_size);

}  // namespace zero3::ckpt

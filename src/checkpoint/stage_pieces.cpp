#include "checkpoint/stage_pieces.hpp"

#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/manifest.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

std::string piece_to_json(const StagePiece& piece) {
  ordered_json ranges = ordered_json::array();
  for (const NamedRange& r : piece.ranges) ranges.push_back({r.unit, r.begin, r.length});
  ordered_json j = {{"pipeline_stage", piece.pipeline_stage},
                    {"stage_rank", piece.stage_rank},
                    {"error", piece.error},
                    {"training_state", piece.training_state},
                    {"buffers", piece.buffers},
                    {"ranges", std::move(ranges)},
                    {"units", ordered_json::parse(units_to_json(piece.units))}};
  return j.dump();
}

StagePiece piece_from_json(const std::string& text, int rank) {
  const std::string label = "the part of the save rank " + str(rank) + " described";
  try {
    const json j = json::parse(text);
    StagePiece p;
    p.pipeline_stage = j.at("pipeline_stage").get<int>();
    p.stage_rank = j.at("stage_rank").get<int>();
    p.error = j.at("error").get<std::string>();
    p.training_state = j.at("training_state").get<std::string>();
    p.buffers = j.at("buffers").get<int64_t>();
    for (const json& r : j.at("ranges")) {
      p.ranges.push_back({r.at(0).get<std::string>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>()});
    }
    p.units = units_from_json(j.at("units").dump(), label);
    return p;
  } catch (const json::exception& e) {
    throw CheckpointError(label + " is not readable: " + e.what());
  }
}

PipelineLayout merge_pieces(const std::vector<StagePiece>& pieces, int stages, int data_parallel_size) {
  // Errors first: a rank that could not describe its part is what the user needs to see.
  std::string errors;
  for (size_t r = 0; r < pieces.size(); ++r) {
    if (!pieces[r].error.empty())
      errors += (errors.empty() ? "" : "; ") + ("rank " + str(static_cast<int64_t>(r)) + ": " + pieces[r].error);
  }
  if (!errors.empty()) throw CheckpointError(errors);

  // Where every (stage, stage rank) is in the world.
  std::vector<int> world_rank(static_cast<size_t>(stages) * static_cast<size_t>(data_parallel_size), -1);
  for (size_t r = 0; r < pieces.size(); ++r) {
    const StagePiece& p = pieces[r];
    if (p.pipeline_stage < 0 || p.pipeline_stage >= stages || p.stage_rank < 0 || p.stage_rank >= data_parallel_size) {
      throw CheckpointError("rank " + str(static_cast<int64_t>(r)) + " is rank " + str(p.stage_rank) +
                            " of pipeline stage " + str(p.pipeline_stage) + ", outside " + str(stages) + " stages x " +
                            str(data_parallel_size) + " data-parallel ranks");
    }
    int& slot = world_rank[static_cast<size_t>(p.pipeline_stage * data_parallel_size + p.stage_rank)];
    if (slot >= 0) {
      throw CheckpointError("ranks " + str(slot) + " and " + str(static_cast<int64_t>(r)) + " are both rank " +
                            str(p.stage_rank) + " of pipeline stage " + str(p.pipeline_stage));
    }
    slot = static_cast<int>(r);
  }
  if (pieces.size() != world_rank.size()) {
    throw CheckpointError(str(static_cast<int64_t>(pieces.size())) + " ranks for " + str(stages) +
                          " pipeline stages x " + str(data_parallel_size) + " data-parallel ranks");
  }

  for (const StagePiece& q : pieces) {
    if (q.buffers > 0) {
      throw CheckpointError("pipeline stage " + str(q.pipeline_stage) + "'s engine lists " + str(q.buffers) +
                            " model buffer(s) (Engine::set_buffer_source): a checkpoint of a pipelined run holds "
                            "parameters and optimizer state only; model buffers are not saved there yet");
    }
  }
  const StagePiece& first = pieces[static_cast<size_t>(world_rank[0])];
  PipelineLayout out;
  std::map<std::string, int> unit_index;
  for (int s = 0; s < stages; ++s) {
    const int leader = world_rank[static_cast<size_t>(s * data_parallel_size)];
    const StagePiece& p = pieces[static_cast<size_t>(leader)];
    if (p.training_state != first.training_state) {
      throw CheckpointError("pipeline stage " + str(s) + " (rank " + str(leader) + ") is at training state " +
                            p.training_state + ", pipeline stage 0 at " + first.training_state +
                            " (every stage takes the same optimizer steps: were the stages' engines trained apart?)");
    }
    for (CheckpointUnit u : p.units) {
      u.pipeline_stage = s;
      const auto [it, fresh] = unit_index.emplace(u.name, static_cast<int>(out.units.size()));
      if (!fresh) {
        throw CheckpointError("unit '" + u.name + "' is declared by pipeline stage " +
                              str(out.units[static_cast<size_t>(it->second)].pipeline_stage) + " and by stage " +
                              str(s) + ": a checkpoint names every unit once");
      }
      out.units.push_back(std::move(u));
    }
  }
  for (int s = 0; s < stages; ++s) {
    for (int q = 0; q < data_parallel_size; ++q) {
      const int r = world_rank[static_cast<size_t>(s * data_parallel_size + q)];
      const StagePiece& p = pieces[static_cast<size_t>(r)];
      if (p.ranges.empty()) continue;
      CheckpointFile f;
      f.rank = q;
      f.pipeline_stage = s;
      f.name = stage_rank_file_name(s, stages, q, data_parallel_size);
      for (const NamedRange& range : p.ranges) {
        const auto it = unit_index.find(range.unit);
        if (it == unit_index.end() || out.units[static_cast<size_t>(it->second)].pipeline_stage != s) {
          throw CheckpointError("rank " + str(r) + " (rank " + str(q) + " of pipeline stage " + str(s) +
                                ") holds elements of unit '" + range.unit +
                                "', which its stage's first rank does not declare (the ranks of a stage declare "
                                "the same units)");
        }
        f.ranges.push_back({it->second, range.begin, range.length});
      }
      out.files.push_back(std::move(f));
      out.file_ranks.push_back(r);
    }
  }
  return out;
}

}  // namespace zero3::ckpt

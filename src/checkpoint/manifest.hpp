// manifest.json of a checkpoint: the CheckpointInfo of checkpoint.hpp as JSON, and the checks a manifest must
// pass before anything trusts it (every unit's elements covered by exactly one file range, offsets
// consistent with shapes, names safe to use as file names).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/checkpoint.hpp"

namespace zero3::ckpt {

inline constexpr const char* kFormatName = "zero3-checkpoint";
inline constexpr int kFormatVersion = 1;          // a checkpoint of one Engine
inline constexpr int kPipelineFormatVersion = 2;  // a pipelined run's (its "pipeline" section); the newest read
inline constexpr const char* kManifestName = "manifest.json";

// The three fp32 arrays a file holds for each of its ranges.
enum class StatePart : int { master = 0, exp_avg = 1, exp_avg_sq = 2 };
inline constexpr StatePart kStateParts[] = {StatePart::master, StatePart::exp_avg, StatePart::exp_avg_sq};
const char* state_part_name(StatePart part);  // "master", "exp_avg", "exp_avg_sq"
// The array of `part` in a rank's shard of a unit.
float* state_part_data(const ShardView& view, StatePart part);
// "<unit>.<part>": the tensor's name in a shard file.
std::string shard_tensor_name(const std::string& unit, StatePart part);

// "rank-00003-of-00016.safetensors"
std::string rank_file_name(int rank, int world_size);
// A pipelined run's: "stage-01-of-04-rank-00000-of-00002.safetensors" (rank in the stage's data-parallel group).
std::string stage_rank_file_name(int stage, int stages, int rank, int data_parallel_size);
// The file `rank` (of `pipeline_stage`, in a pipelined checkpoint) writes: one of the two above.
std::string shard_file_name(const CheckpointInfo& info, int pipeline_stage, int rank);

// A list of units as the manifest's "units" JSON array (without their pipeline stages), and back with every
// check a manifest's units pass (`label` names the text in errors): a pipelined save gathers its stages'
// units this way.
std::string units_to_json(const std::vector<CheckpointUnit>& units);
std::vector<CheckpointUnit> units_from_json(std::string_view text, const std::string& label);

// Pretty-printed JSON (format, versions, config as an object, units, files, state, extras).
std::string manifest_to_json(const CheckpointInfo& info);

// Parses and validates a manifest's text. `path` (the manifest file) names it in errors; info.path is set to
// its directory. Throws CheckpointError "<path>: <what is wrong>".
CheckpointInfo manifest_from_json(std::string_view text, const std::filesystem::path& path);

// Reads DIR/TAG/manifest.json (`checkpoint_dir` is DIR/TAG). Throws CheckpointError (missing or unreadable
// manifest included).
CheckpointInfo read_manifest(const std::filesystem::path& checkpoint_dir);

// The saving run's gradient_accumulation_steps (from the manifest's config), or nullopt when it does not say.
std::optional<int64_t> saved_gradient_accumulation_steps(const CheckpointInfo& info);

// 8 lowercase hex digits.
std::string crc_hex(uint32_t crc);

// Metadata a shard file carries in its safetensors header beside "format" ("zero3-checkpoint-shard"), "tag",
// "rank" and "world_size": "ranges", the file's ranges as compact JSON [["unit", begin, length], ...], and
// "training_state", the save's counters as the manifest's JSON object. The header lies inside the bytes the
// file's CRC-32C covers, so each file is bound to the ranges and counters the manifest claims for it.
std::string ranges_metadata(const std::vector<std::string>& unit_names, const std::vector<CheckpointRange>& ranges);
std::string training_state_metadata(const TrainingState& state);

}  // namespace zero3::ckpt

// Checkpoints: sharded save and exact resume on any world size, and export to Hugging Face safetensors.
//
// A training program saves and resumes like this:
//
//   zero3::LoadedCheckpoint resumed;
//   if (zero3::checkpoint_exists(dir)) {                       // DIR/latest names a checkpoint
//     resumed = zero3::load_checkpoint(engine, dir);           // after materialize(), before the first scope
//     sampler.seek(resumed.extra_int("samples_seen"));
//   }
//   for (...) {
//     ... forward and backward scopes, engine.step() ...
//     if (r.boundary && r.global_step % 1000 == 0)
//       zero3::save_checkpoint(engine, dir, "global_step" + std::to_string(r.global_step),
//                              {{"samples_seen", std::to_string(sampler.position())}});
//   }
//   zero3::save_16bit_model(engine, "out/hf");                 // bf16 safetensors for the ecosystem
//
// Layout (docs/checkpoints.md has the details):
//   DIR/latest                          the tag of the newest complete checkpoint (one line)
//   DIR/TAG/manifest.json               format version, config, world size, stage, units and parameters
//                                       (names, shapes, dtypes, offsets), which elements of which unit each
//                                       file holds, training state, user extras, size + CRC-32C per file
//   DIR/TAG/rank-00003-of-00016.safetensors
//                                       rank 3's fp32 master weights and Adam moments of its slice of every
//                                       unit: tensors "<unit>.master", "<unit>.exp_avg", "<unit>.exp_avg_sq"
//   DIR/TAG/buffers.safetensors         the model's buffers (Engine::set_buffer_source), rank 0's values under
//                                       their own names; only when the model has buffers
//
// Guarantees. A save is written into DIR/.tmp-TAG-<nonce>/ (every file fsync'ed), committed by renaming that
// directory to DIR/TAG, and only then published by rewriting DIR/latest (atomically). A process or machine
// that dies at any moment leaves the previous checkpoint and DIR/latest complete and valid. A load checks the
// manifest, the model (unit and parameter names, shapes, dtypes) and the size and CRC-32C of every file it
// needs before it changes any engine state, and reports what is wrong as a CheckpointError naming the file.
// A checkpoint loads on any world size, any ZeRO stage and any layout (plain, hpZ, MiCS, a pipeline of any number of
// stages: zero3/pipeline_checkpoint.hpp): each rank reads the byte
// ranges of the saved files that cover its new slice (no conversion step). Under MiCS the first shard group's ranks
// save (every group holds the whole model). Master weights, Adam moments, step counters and the
// loss scaler come back exactly; the learning-rate schedule follows from the step count, so training
// continues as if it had not stopped (bit for bit on the same world size).
//
// Collectives. save_checkpoint, load_checkpoint and save_16bit_model are collective over the engine's
// communicator: every rank calls them, with the same arguments, between micro-steps (every scope closed, after
// step() or before the first scope of a micro-step). They block until the whole job is done. On failure every
// rank throws (a CheckpointError, or the CommError of a failed collective), so no rank is left waiting. The
// directory must be the same path on a file system every rank sees (NFS, FSx for Lustre, or one machine's
// disk). With checkpoint.use_node_local_storage the directory is instead local to each node: the first rank of
// every node (ranks grouped by host name) commits a complete manifest and DIR/latest into its node's DIR, beside
// the files of that node's ranks only; such a checkpoint loads on the same ranks per node (a load that needs
// another node's file names it). The functions without an Engine are local and may run anywhere (the
// `zero3 ckpt` command uses them).
//
// Threads: the calls use the engine and its communicator from the calling thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zero3/dtype.hpp"
#include "zero3/engine.hpp"

namespace zero3 {

// The training program's own state, saved beside the engine's and handed back by load_checkpoint: the data
// sampler's position (epoch, samples seen), RNG seeds, anything needed to continue exactly. Keys and values
// are UTF-8 text (numbers as std::to_string, structured state as a JSON document in one value). Meant for
// small state: it lives in the manifest.
using CheckpointExtras = std::map<std::string, std::string>;

// What save_checkpoint wrote (the same on every rank, except the rank_* fields).
struct SavedCheckpoint {
  std::filesystem::path path;  // DIR/TAG
  std::string tag;
  int files = 0;                  // shard files of all ranks (ranks that hold nothing write none)
  uint64_t bytes = 0;             // their total size
  uint64_t rank_bytes = 0;        // this rank's shard file (0 when it wrote none)
  double rank_write_seconds = 0;  // this rank writing and fsync'ing its file
  double seconds = 0;             // the whole save, commit included, as this rank saw it
};

// What load_checkpoint restored.
struct LoadedCheckpoint {
  std::filesystem::path path;  // DIR/TAG
  std::string tag;             // the resolved tag ("latest" replaced by the tag it named)
  int saved_world_size = 0;
  int saved_stage = 0;
  int saved_pipeline_stages = 1;  // of a pipelined run (zero3/pipeline_checkpoint.hpp); 1 otherwise
  // The saved slices differ from the engine's: another world size, another partition (MiCS's shard size), or
  // stage 0 (whole units on every rank) against a sharded stage.
  bool resharded = false;
  TrainingState training_state;  // as restored into the engine
  CheckpointExtras extras;       // as given to save_checkpoint
  uint64_t bytes_read = 0;       // this rank: bytes read to verify checksums and to fill its slices
  double seconds = 0;

  // The integer the program saved under `key` in its extras (as std::to_string writes it). Throws
  // CheckpointError naming the manifest and extras.<key> when the key is missing or its value is not a
  // decimal integer that fits 64 bits.
  int64_t extra_int(const std::string& key) const;
};

// Saves the engine's state as DIR/TAG and points DIR/latest at it. Collective. `tag` is a file name: not
// empty, no '/' or control characters, not starting with '.', not "latest". An existing DIR/TAG is replaced (atomically
// where the file system can exchange two directories; otherwise the old one is renamed away first and removed after).
// Directories DIR/.tmp-* and DIR/.old-* left by interrupted saves are removed. The engine's state is not
// changed. Throws InvalidArgument for a bad tag or a save inside a gradient accumulation window (the partial
// gradients are not part of a checkpoint: save after the step() that ends the window), CheckpointError when a
// file cannot be written (naming it and the rank), and the config's checkpoint.tag_validation decides
// whether ranks passing different tags is an error ("Fail") or a warning.
SavedCheckpoint save_checkpoint(Engine& engine, const std::filesystem::path& dir, const std::string& tag,
                                const CheckpointExtras& extras = {});

// Restores DIR/TAG ("latest": the tag DIR/latest names) into a materialized engine. Collective. The model the
// engine declared must match the checkpoint's: the same units (found by name, so a pipelined run's checkpoint
// loads too) with the same parameters, in order, of the same shapes and compute dtypes (CheckpointError naming
// the first difference). The world size, the stage and the
// rest of the config may differ. Verified before anything changes: the manifest, and the size and CRC-32C of
// every file this rank reads. Then fills every rank's slices (fp32 master weights, Adam moments), restores
// the counters and the loss scaler, recomputes the compute-dtype parameters, and writes the saved buffers into
// every rank's Engine::buffers() (the same names, types and shapes as the checkpoint's, else CheckpointError). A
// failure while filling the slices (a disk error after the files verified) leaves the engine's state partly
// overwritten: the CheckpointError says so; load again or rebuild the engine.
LoadedCheckpoint load_checkpoint(Engine& engine, const std::filesystem::path& dir, const std::string& tag = "latest");

// ---- Reading checkpoints without an engine (local; for tools, and for training programs that decide what
// to resume). ----

// The tag DIR/latest names (when `tag` is "latest"), else `tag`. Throws CheckpointError when DIR/latest is
// missing, empty or not a valid tag.
std::string resolve_checkpoint_tag(const std::filesystem::path& dir, const std::string& tag = "latest");

// Whether DIR/latest exists and the checkpoint it names has a manifest (nothing is verified).
bool checkpoint_exists(const std::filesystem::path& dir);

// The tags of the complete checkpoints in DIR (directories holding a manifest.json), sorted.
std::vector<std::string> list_checkpoints(const std::filesystem::path& dir);

struct CheckpointParam {
  std::string name;       // local name within the unit
  std::string full_name;  // "<unit>.<name>"
  std::vector<int64_t> shape;
  DType dtype = DType::f32;  // compute dtype in the training run
  int64_t offset = 0;        // first element in the unit's flat buffer
  int64_t numel = 0;
};

struct CheckpointUnit {
  std::string name;
  DType dtype = DType::f32;
  int64_t numel = 0;         // elements of its parameters
  int64_t slice_numel = 0;   // ceil(numel / ranks it is partitioned over): what each of them owns at stages 1-3
  int64_t padded_numel = 0;  // slice_numel * those ranks
  std::vector<CheckpointParam> params;
  // A pipelined run's checkpoint: the pipeline stage whose engine held the unit, partitioned over that stage's
  // data-parallel ranks (CheckpointInfo::data_parallel_size()). 0 otherwise.
  int pipeline_stage = 0;
};

// Elements [begin, begin + length) of a unit's flat buffer, held by a file as the tensors
// "<unit>.master", "<unit>.exp_avg" and "<unit>.exp_avg_sq" of `length` fp32 elements each.
struct CheckpointRange {
  int unit = 0;  // index into CheckpointInfo::units
  int64_t begin = 0;
  int64_t length = 0;
};

struct CheckpointFile {
  std::string name;  // file name inside DIR/TAG
  int rank = 0;      // the rank that wrote it (a pipelined run's: its rank in its stage's data-parallel group)
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  std::vector<CheckpointRange> ranges;
  int pipeline_stage = 0;  // a pipelined run's: the stage of the rank that wrote it (0 otherwise)
};

// A model buffer a checkpoint holds (Engine::set_buffer_source): rank 0's value at the save.
struct CheckpointBuffer {
  std::string name;
  safetensors::Dtype dtype = safetensors::Dtype::f32;
  std::vector<int64_t> shape;
};

// A checkpoint's manifest.
struct CheckpointInfo {
  std::filesystem::path path;  // DIR/TAG
  std::string tag;
  int format_version = 0;
  std::string zero3_version;  // of the program that saved it
  std::string created;        // UTC, ISO 8601
  int world_size = 0;
  int stage = 0;
  // A pipelined run's checkpoint (zero3/pipeline_checkpoint.hpp): pipeline.stages stage engines, each holding its
  // stage's units partitioned over world_size / pipeline_stages data-parallel ranks. 1 for a checkpoint of one
  // Engine (its units partitioned over world_size ranks).
  int pipeline_stages = 1;
  int data_parallel_size() const { return world_size / pipeline_stages; }
  std::string config_json;  // the resolved DeepSpeed config of the run that saved it
  TrainingState training_state;
  CheckpointExtras extras;
  std::vector<CheckpointUnit> units;
  std::vector<CheckpointFile> files;
  // The model's buffers, all in buffers_file ("buffers.safetensors", written by rank 0, no ranges). A checkpoint
  // of a model without buffers has none, and buffers_file.name is empty.
  std::vector<CheckpointBuffer> buffers;
  CheckpointFile buffers_file;

  int64_t parameter_count() const;  // over all units
  uint64_t total_bytes() const;     // of all files, the buffers' included
};

// Reads and validates DIR/TAG/manifest.json (structure, consistency of units, parameters and file ranges).
// Reads no shard file. Throws CheckpointError naming the manifest and what is wrong.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& dir, const std::string& tag = "latest");

// The outcome of checking one file of a checkpoint.
struct FileCheck {
  std::string file;
  bool ok = false;
  std::string problem;  // empty when ok: missing, wrong size, CRC-32C mismatch, bad safetensors header, ...
};

// Checks every file of `info`: present, of the recorded size and CRC-32C, a valid safetensors file holding
// the tensors the manifest says. Reads every byte. Never throws for a bad file (it is reported); throws
// CheckpointError only when `info` itself is unusable.
std::vector<FileCheck> verify_checkpoint_files(const CheckpointInfo& info);

// read_checkpoint_info + verify_checkpoint_files; throws CheckpointError naming the first bad file.
CheckpointInfo verify_checkpoint(const std::filesystem::path& dir, const std::string& tag = "latest");

// ---- Start-up check of an output directory ----

// Checks a directory the run will write into (checkpoints, exported weights), so that a bad path fails before
// training instead of at the first save or at the end: creates `dir` with its parents when it is missing, then
// requires that it is a directory, that a file can be created, written and removed there (which finds a
// read-only file system, permissions, ACLs and quotas; permission bits do not stop root, whose saves would
// work), and, when `bytes_needed` > 0, that its file system has that many bytes available to this user.
// `what` names the path in errors ("--save-dir"), `needed_for` what the bytes are for ("one checkpoint").
// Local: call it on every rank that will write there. Throws CheckpointError "<what> <dir>: <why>".
void check_output_directory(const std::filesystem::path& dir, const std::string& what, uint64_t bytes_needed = 0,
                            const std::string& needed_for = "");

// ---- Export to Hugging Face safetensors ----

// How parameters are named in exported safetensors files.
enum class TensorNaming : uint8_t {
  automatic,  // local names when they are unique over the model (the Llama example's units hold parameters
              // named exactly as Hugging Face's, e.g. "model.layers.3.mlp.up_proj.weight"), else full names
  full,       // "<unit>.<param>"
  local,      // the parameter's name within its unit; CheckpointError when two units share one
};

struct ExportOptions {
  // Element type of the exported tensors. nullopt: consolidate_checkpoint writes each parameter in the compute
  // dtype of the run; save_16bit_model writes the compute dtype when it is 16-bit, else bf16.
  std::optional<DType> dtype;
  // Largest data bytes per file, as save_pretrained's max_shard_size (5 GB). Larger models are split into
  // model-0000K-of-0000N.safetensors with model.safetensors.index.json.
  uint64_t max_shard_bytes = 5'000'000'000;
  TensorNaming naming = TensorNaming::automatic;
  // Output names for some parameters, by full name ("<unit>.<param>"); applied before `naming`, which names
  // the rest. Every key must be a parameter; the output names must be unique.
  std::map<std::string, std::string> name_map;
  // consolidate_checkpoint: check the size and CRC-32C of every shard file before reading it.
  bool verify = true;
};

// What an export wrote.
struct ExportedModel {
  std::filesystem::path dir;
  std::vector<std::string> files;  // safetensors files, then the index when there is one
  int64_t tensors = 0;
  int64_t parameters = 0;       // elements
  uint64_t bytes = 0;           // size of the files
  DType dtype = DType::bf16;    // the dtype asked for (automatic: of the first tensor)
  std::string summary() const;  // "wrote 291 tensors (8.03e9 parameters, bf16) in 4 files, 16.1 GB, to DIR"
};

// Writes DIR/TAG's model weights (the fp32 master copy, converted to `options.dtype`), then its buffers (under
// their names, in their own types), as Hugging Face safetensors into `out_dir` (created if missing), streaming unit by
// unit: memory holds one unit at a time, not the model. Local (no engine, no communicator). Throws CheckpointError for
// a bad checkpoint or name rule, IoError when writing fails.
ExportedModel consolidate_checkpoint(const std::filesystem::path& dir, const std::string& tag,
                                     const std::filesystem::path& out_dir, const ExportOptions& options = {});

// Gathers the engine's fp32 master weights unit by unit and has rank 0 write them as safetensors (bf16 by
// default, see ExportOptions::dtype), then rank 0's Engine::buffers() in their own types, into `out_dir`: DeepSpeed's
// save_16bit_model. Collective (one all-gather per unit); every rank returns the same description, and rank 0 logs it.
// zero_optimization.stage3_gather_16bit_weights_on_model_save = false does not turn this into a silent no-op as it
// does in DeepSpeed: the weights are written and a note says so.
ExportedModel save_16bit_model(Engine& engine, const std::filesystem::path& out_dir, const ExportOptions& options = {});

}  // namespace zero3

// save_checkpoint: every rank writes its shard file into DIR/.tmp-TAG-<nonce>/, the ranks agree that all files
// are complete, rank 0 writes the manifest, renames the directory into place and only then updates
// DIR/latest. See checkpoint.hpp for the contract and crash_point.hpp for where a save can be cut short.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <future>
#include <random>

#include "checkpoint/checkpoint_dir.hpp"
#include "checkpoint/checkpoint_ranks.hpp"
#include "checkpoint/crash_point.hpp"
#include "checkpoint/crc32c.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/model_buffers.hpp"
#include "checkpoint/rank_reports.hpp"
#include "checkpoint/save_on_node.hpp"
#include "checkpoint/stage_pieces.hpp"
#include "core/check.hpp"
#include "io/atomic_file.hpp"
#include "io/file_util.hpp"
#include "io/safetensors_detail.hpp"
#include "zero3/checkpoint.hpp"
#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"
#include "zero3/safetensors.hpp"
#include "zero3/version.hpp"

namespace zero3 {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Clock = std::chrono::steady_clock;
using ckpt::RankReport;
using ckpt::StatePart;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t random_nonce() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(rd()) << 32) | rd()) ^ (t * 0x9E3779B97F4A7C15ull);
}

std::string utc_time(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The elements of a unit one rank saves: its slice's valid part, or, for a unit every rank holds whole
// (stage 0), the whole unit on rank 0 only. Under MiCS every shard group holds the whole model: the first group's
// ranks (0 .. partition_size - 1) save it, the replicas write nothing.
struct Piece {
  UnitId unit;
  int64_t begin = 0;
  int64_t length = 0;
};

// Stage 0 keeps whole units on every rank (local_shard() is the whole buffer there).
bool replicated(const Engine& engine) { return engine.world_size() > 1 && engine.stage() == 0; }

std::vector<Piece> pieces_of_rank(Engine& engine, int rank) {
  std::vector<Piece> out;
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitId id{static_cast<int32_t>(i)};
    const UnitInfo& u = engine.unit(id);
    if (replicated(engine)) {
      if (rank == 0) out.push_back({id, 0, u.numel});
      continue;
    }
    if (rank >= engine.partition_size()) continue;
    const SliceInfo s = engine.slice(id, rank);
    if (s.valid > 0) out.push_back({id, s.offset, s.valid});
  }
  return out;
}

// This rank's pieces, checked against what local_shard() says the rank holds.
std::vector<Piece> my_pieces(Engine& engine) {
  std::vector<Piece> pieces = pieces_of_rank(engine, engine.rank());
  for (const Piece& p : pieces) {
    const ShardView v = engine.local_shard(p.unit);
    if (p.begin < v.begin || p.begin + p.length > v.begin + v.length) {
      throw CheckpointError("unit '" + engine.unit(p.unit).name + "': the engine's slice of rank " +
                            std::to_string(engine.rank()) + " [" + std::to_string(v.begin) + ", " +
                            std::to_string(v.begin + v.length) + ") does not hold the elements [" +
                            std::to_string(p.begin) + ", " + std::to_string(p.begin + p.length) +
                            ") its partition assigns it");
    }
  }
  return pieces;
}

// Appends `bytes` to the tensor being written and returns the CRC continued over them. Large pieces are checksummed
// on a second thread while this one writes them: both only read the buffer, and the CRC (several GB/s) then
// hides behind the write instead of adding to it.
uint32_t write_with_crc(st::SafetensorsWriter& writer, const std::string& name, const void* data, size_t bytes,
                        uint32_t crc) {
  constexpr size_t kParallelFrom = size_t{4} << 20;
  if (bytes < kParallelFrom) {
    writer.write(name, data, bytes);
    return ckpt::crc32c_update(crc, data, bytes);
  }
  std::future<uint32_t> piece =
      std::async(std::launch::async, [data, bytes] { return ckpt::crc32c_update(0, data, bytes); });
  try {
    writer.write(name, data, bytes);
  } catch (...) {
    piece.wait();  // the thread reads `data`: it must be done before the caller may free it
    throw;
  }
  return ckpt::crc32c_combine(crc, piece.get(), bytes);
}

struct WrittenShard {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Writes the rank's pieces as one safetensors file: per piece, master, exp_avg and exp_avg_sq, each written with
// one write() straight from the engine's memory (cpu device) or in large staged chunks (other devices), then
// fsync'ed and renamed into place by the safetensors writer. The CRC-32C is computed on the way; the header,
// which the writer lays down itself, is read back (a few KB) and combined in front of it.
WrittenShard write_shard(const ckpt::CheckpointRanks& ranks, const fs::path& path, const std::vector<Piece>& pieces,
                         const std::string& tag, const TrainingState& state) {
  Engine& engine = ranks.engine;
  std::vector<st::TensorDecl> decls;
  std::vector<CheckpointRange> ranges;
  for (const Piece& p : pieces) {
    for (StatePart part : ckpt::kStateParts) {
      decls.push_back({ckpt::shard_tensor_name(engine.unit(p.unit).name, part), st::Dtype::f32, {p.length}});
    }
    ranges.push_back({p.unit.index, p.begin, p.length});
  }
  std::vector<std::string> unit_names;
  for (size_t i = 0; i < engine.num_units(); ++i)
    unit_names.push_back(engine.unit(UnitId{static_cast<int32_t>(i)}).name);
  // Bound into the file (its header is under the CRC-32C): which elements it holds and at which step.
  // A pipelined run's file: the rank in its stage's data-parallel group, the world size of the whole pipeline.
  std::map<std::string, std::string> metadata = {{"format", "zero3-checkpoint-shard"},
                                                 {"tag", tag},
                                                 {"rank", std::to_string(engine.rank())},
                                                 {"world_size", std::to_string(ranks.comm.size())},
                                                 {"ranges", ckpt::ranges_metadata(unit_names, ranges)},
                                                 {"training_state", ckpt::training_state_metadata(state)}};
  if (ranks.pipelined()) {
    metadata["pipeline_stage"] = std::to_string(ranks.pipeline_stage);
    metadata["pipeline_stages"] = std::to_string(ranks.pipeline_stages);
  }
  st::SafetensorsWriter writer(path, decls, metadata);
  Device& device = engine.device();
  const bool host = device.type() == DeviceType::cpu;
  constexpr size_t kStage = size_t{64} << 20;
  std::vector<unsigned char> staging;
  uint32_t data_crc = 0;
  uint64_t data_bytes = 0;
  bool first = true;
  for (const Piece& p : pieces) {
    const ShardView v = engine.local_shard(p.unit);
    for (StatePart part : ckpt::kStateParts) {
      const std::string& name = decls[static_cast<size_t>(&p - pieces.data()) * 3 + static_cast<size_t>(part)].name;
      const float* src = ckpt::state_part_data(v, part);
      if (src == nullptr) {
        throw CheckpointError("unit '" + engine.unit(p.unit).name + "' has no " + ckpt::state_part_name(part) +
                              " on rank " + std::to_string(engine.rank()));
      }
      src += p.begin - v.begin;
      const size_t bytes = static_cast<size_t>(p.length) * sizeof(float);
      if (host) {
        data_crc = write_with_crc(writer, name, src, bytes, data_crc);
      } else {
        if (staging.empty()) staging.resize(std::min(kStage, bytes));
        for (size_t off = 0; off < bytes; off += kStage) {
          const size_t n = std::min(kStage, bytes - off);
          if (staging.size() < n) staging.resize(n);
          device.copy(staging.data(), reinterpret_cast<const unsigned char*>(src) + off, n);
          data_crc = write_with_crc(writer, name, staging.data(), n, data_crc);
        }
      }
      data_bytes += bytes;
    }
    if (first) ckpt::crash_point("shard_partial", ranks.comm.rank());
    first = false;
  }
  writer.finish();

  WrittenShard out;
  out.bytes = writer.file_size();
  const uint64_t head = out.bytes - data_bytes;
  std::vector<unsigned char> header(head);
  io::FileDescriptor fd = io::open_read(path);
  io::pread_exact(fd.get(), header.data(), header.size(), 0, path);
  out.crc = ckpt::crc32c_combine(ckpt::crc32c_update(0, header.data(), header.size()), data_crc, data_bytes);
  return out;
}

// What every manifest says of the save, whatever the ranks.
CheckpointInfo describe_save(const ckpt::CheckpointRanks& ranks, const std::string& tag, const std::string& created,
                             const TrainingState& state, const CheckpointExtras& extras) {
  CheckpointInfo info;
  info.tag = tag;
  info.format_version = ranks.pipelined() ? ckpt::kPipelineFormatVersion : ckpt::kFormatVersion;
  info.zero3_version = version();
  info.created = created;
  info.world_size = ranks.comm.size();
  info.stage = ranks.engine.stage();
  info.pipeline_stages = ranks.pipeline_stages;
  info.config_json = to_json(ranks.engine.config());
  info.training_state = state;
  info.extras = extras;
  return info;
}

// The units of an engine as a manifest lists them.
std::vector<CheckpointUnit> describe_units(Engine& engine) {
  std::vector<CheckpointUnit> units;
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitInfo& u = engine.unit(UnitId{static_cast<int32_t>(i)});
    CheckpointUnit cu;
    cu.name = u.name;
    cu.dtype = u.dtype;
    cu.numel = u.numel;
    cu.slice_numel = u.slice_numel;
    cu.padded_numel = u.padded_numel;
    for (ParamId pid : u.params) {
      const ParamInfo& p = engine.param(pid);
      cu.params.push_back({p.local_name, p.name, p.shape, p.dtype, p.offset, p.numel});
    }
    units.push_back(std::move(cu));
  }
  return units;
}

// The manifest of one Engine's save: its units, and a file per rank that holds a slice.
CheckpointInfo describe(const ckpt::CheckpointRanks& ranks, const std::string& tag, const std::string& created,
                        const TrainingState& state, const CheckpointExtras& extras,
                        const std::vector<RankReport>& shards) {
  Engine& engine = ranks.engine;
  CheckpointInfo info = describe_save(ranks, tag, created, state, extras);
  info.units = describe_units(engine);
  for (int r = 0; r < engine.world_size(); ++r) {
    const RankReport& rep = shards[static_cast<size_t>(r)];
    const std::vector<Piece> pieces = pieces_of_rank(engine, r);
    if ((rep.a > 0) != !pieces.empty()) {
      throw CheckpointError("rank " + std::to_string(r) +
                            (rep.a > 0 ? " wrote a shard file although it holds nothing"
                                       : " wrote no shard file although it holds slices"));
    }
    if (pieces.empty()) continue;
    CheckpointFile f;
    f.name = ckpt::rank_file_name(r, engine.world_size());
    f.rank = r;
    f.bytes = rep.a;
    f.crc32c = static_cast<uint32_t>(rep.b);
    for (const Piece& p : pieces) f.ranges.push_back({p.unit.index, p.begin, p.length});
    info.files.push_back(std::move(f));
  }
  return info;
}

// The manifest of a pipelined save: the stages' units and files as merged from every rank's piece, with the sizes
// and checksums the ranks reported after writing.
CheckpointInfo describe_pipeline(const ckpt::CheckpointRanks& ranks, const std::string& tag, const std::string& created,
                                 const TrainingState& state, const CheckpointExtras& extras,
                                 const ckpt::PipelineLayout& layout, const std::vector<RankReport>& shards) {
  CheckpointInfo info = describe_save(ranks, tag, created, state, extras);
  info.units = layout.units;
  info.files = layout.files;
  std::vector<bool> writes(shards.size(), false);
  for (size_t i = 0; i < info.files.size(); ++i) {
    const RankReport& rep = shards[static_cast<size_t>(layout.file_ranks[i])];
    info.files[i].bytes = rep.a;
    info.files[i].crc32c = static_cast<uint32_t>(rep.b);
    writes[static_cast<size_t>(layout.file_ranks[i])] = true;
  }
  for (size_t r = 0; r < shards.size(); ++r) {
    if ((shards[r].a > 0) != writes[r]) {
      throw CheckpointError("rank " + std::to_string(r) +
                            (shards[r].a > 0 ? " wrote a shard file although it holds nothing"
                                             : " wrote no shard file although it holds slices"));
    }
  }
  return info;
}

// This rank's part of a pipelined save, for the other ranks to merge into the manifest (stage_pieces.hpp).
ckpt::StagePiece describe_piece(const ckpt::CheckpointRanks& ranks, const TrainingState& state) {
  Engine& engine = ranks.engine;
  ckpt::StagePiece piece;
  piece.pipeline_stage = ranks.pipeline_stage;
  piece.stage_rank = engine.rank();
  try {
    piece.training_state = ckpt::training_state_metadata(state);
    piece.buffers = static_cast<int64_t>(engine.buffers().size());
    for (const Piece& p : my_pieces(engine)) piece.ranges.push_back({engine.unit(p.unit).name, p.begin, p.length});
    if (engine.rank() == 0) piece.units = describe_units(engine);
  } catch (const std::exception& e) {
    piece.error = e.what();
  }
  return piece;
}

void check_extras(const CheckpointExtras& extras) {
  for (const auto& [k, v] : extras) {
    if (!st::detail::valid_utf8(k) || !st::detail::valid_utf8(v)) {
      throw InvalidArgument("save_checkpoint: extras entry " + st::detail::printable(k) +
                            " is not valid UTF-8 (extras are text; encode binary state, e.g. as hex)");
    }
  }
}

// Creates DIR, removes what interrupted saves left there, and creates the temp directory of this save.
void prepare_directory(const fs::path& dir, const fs::path& temp) {
  fs::create_directories(dir);
  ckpt::clean_interrupted_saves(dir);
  if (!fs::create_directory(temp)) throw IoError(temp.string() + " exists already");
  io::fsync_directory(dir);
}

bool equal_ignoring_case(const std::string& a, const char* b) {
  const std::string_view bv(b);
  return a.size() == bv.size() && std::equal(a.begin(), a.end(), bv.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

namespace ckpt {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

SavedCheckpoint save_checkpoint_on_node(Engine& engine, const fs::path& dir, const std::string& tag,
                                        const CheckpointExtras& extras, const std::string& node_name) {
  return save_checkpoint_on_node(engine_ranks(engine), dir, tag, extras, node_name);
}

SavedCheckpoint save_checkpoint_on_node(const CheckpointRanks& ranks, const fs::path& dir, const std::string& tag_arg,
                                        const CheckpointExtras& extras, const std::string& node_name) {
  const auto t0 = Clock::now();
  Engine& engine = ranks.engine;
  ckpt::validate_tag(tag_arg);
  ZERO3_REQUIRE(engine.materialized(), InvalidArgument, "save_checkpoint: the engine is not materialized yet");
  ZERO3_REQUIRE(!dir.empty(), InvalidArgument, "save_checkpoint: the checkpoint directory is an empty path");
  const int64_t gas = engine.gradient_accumulation_steps();
  if (engine.micro_steps() % gas != 0) {
    throw InvalidArgument("save_checkpoint at micro-step " + std::to_string(engine.micro_steps()) +
                          " is inside a gradient accumulation window of " + std::to_string(gas) +
                          " micro-steps: the partial gradients are not part of a checkpoint; save after the step() "
                          "that ends the window (StepResult::boundary)");
  }
  check_extras(extras);
  const TrainingState state = saved_training_state(engine);
  const int rank = ranks.comm.rank();
  const int world = ranks.comm.size();
  auto exchange = [&](const RankReport& report, const std::string& phase) {
    return ckpt::exchange_reports(ranks.comm, engine.device(), report, phase);
  };
  if (engine.config().checkpoint.use_node_local_storage && engine.partition_size() < engine.world_size()) {
    throw InvalidArgument(
        "save_checkpoint: checkpoint.use_node_local_storage with MiCS (zero_optimization."
        "mics_shard_size " +
        std::to_string(engine.partition_size()) + " of " + std::to_string(engine.world_size()) +
        " ranks): only the first shard group's ranks save the model, so the other nodes' directories "
        "would hold no files to load; save to a file system every rank sees");
  }

  // 1. Rank 0 prepares DIR and the temp directory; every rank learns rank 0's tag, the nonce, rank 0's clock
  // (the manifest's creation time, the same on every node) and which ranks share a node.
  RankReport mine;
  mine.a = fnv1a(tag_arg);
  mine.d = fnv1a(node_name);
  if (rank == 0) {
    try {
      const uint64_t nonce = random_nonce();
      prepare_directory(dir, ckpt::temp_dir_path(dir, tag_arg, nonce));
      mine.b = nonce;
      mine.c = static_cast<uint64_t>(std::time(nullptr));
      mine.message = tag_arg;
    } catch (const std::exception& e) {
      mine.ok = false;
      mine.message = std::string("cannot prepare the checkpoint directory ") + dir.string() + ": " + e.what();
    }
  }
  const std::string what = "save of checkpoint '" + tag_arg + "' in " + dir.string();
  std::vector<RankReport> reports = exchange(mine, what + " (preparing the directory)");
  ckpt::throw_if_any_failed(reports, what);
  const std::string tag = reports[0].message;
  const uint64_t nonce = reports[0].b;
  const std::string created = utc_time(static_cast<std::time_t>(reports[0].c));
  const fs::path temp = ckpt::temp_dir_path(dir, tag, nonce);
  std::string differing;
  for (int r = 1; r < world; ++r) {
    if (reports[static_cast<size_t>(r)].a != reports[0].a)
      differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differing.empty()) {
    const std::string& mode = engine.config().checkpoint.tag_validation;
    const std::string text = "ranks " + differing + " passed a different checkpoint tag than rank 0's '" + tag + "'";
    if (equal_ignoring_case(mode, "Fail")) {
      if (rank == 0) ckpt::remove_quietly(temp);
      throw CheckpointError(what + ": " + text + " (checkpoint.tag_validation is \"Fail\")");
    }
    if (!equal_ignoring_case(mode, "Ignore")) {
      log::warn_rank0(text, "; saving under rank 0's tag (checkpoint.tag_validation is \"", mode, "\")");
    }
  }

  // Who commits: rank 0 on a shared file system; with checkpoint.use_node_local_storage, the first rank of every
  // node, each into its node's DIR (every node then holds the manifest, its ranks' files and DIR/latest).
  const bool node_local = engine.config().checkpoint.use_node_local_storage;
  std::vector<bool> leader(static_cast<size_t>(world), false);
  leader[0] = true;
  int nodes = 1;
  if (node_local) {
    for (int r = 1; r < world; ++r) {
      bool first = true;
      for (int q = 0; q < r && first; ++q)
        first = reports[static_cast<size_t>(q)].d != reports[static_cast<size_t>(r)].d;
      leader[static_cast<size_t>(r)] = first;
      nodes += first ? 1 : 0;
    }
  }
  const bool is_leader = leader[static_cast<size_t>(rank)];
  if (nodes > 1) {
    mine = RankReport{};
    if (is_leader && rank != 0) {
      try {
        prepare_directory(dir, temp);
      } catch (const std::exception& e) {
        mine.ok = false;
        mine.message =
            "cannot prepare the node-local checkpoint directory " + dir.string() + " on " + node_name + ": " + e.what();
      }
    }
    reports = exchange(mine, what + " (preparing the node-local directories)");
    bool all_ok = true;
    for (const RankReport& r : reports) all_ok &= r.ok;
    if (!all_ok && is_leader) ckpt::remove_quietly(temp);
    ckpt::throw_if_any_failed(reports, what);
  }

  // 1b. A pipeline: every rank describes its part (its stage's units, its ranges, its counters); every rank merges
  // the parts into the manifest's units and files alike, and all refuse together what does not fit.
  ckpt::PipelineLayout layout;
  if (ranks.pipelined()) {
    const std::vector<std::string> texts =
        ckpt::exchange_texts(ranks.comm, engine.device(), ckpt::piece_to_json(describe_piece(ranks, state)),
                             what + " (describing the pipeline stages' parts)");
    try {
      std::vector<ckpt::StagePiece> pieces;
      for (size_t r = 0; r < texts.size(); ++r) pieces.push_back(ckpt::piece_from_json(texts[r], static_cast<int>(r)));
      layout = ckpt::merge_pieces(pieces, ranks.pipeline_stages, world / ranks.pipeline_stages);
    } catch (const std::exception& e) {
      if (is_leader) ckpt::remove_quietly(temp);
      throw CheckpointError(what + ": " + e.what());
    }
  }

  // 2. Every rank writes its shard file.
  SavedCheckpoint result;
  result.tag = tag;
  result.path = dir / tag;
  mine = RankReport{};
  try {
    const std::vector<Piece> pieces = my_pieces(engine);
    if (!pieces.empty()) {
      const auto tw = Clock::now();
      const fs::path file =
          temp / (ranks.pipelined() ? ckpt::stage_rank_file_name(ranks.pipeline_stage, ranks.pipeline_stages,
                                                                 engine.rank(), engine.world_size())
                                    : ckpt::rank_file_name(rank, world));
      WrittenShard shard;
      try {
        shard = write_shard(ranks, file, pieces, tag, state);
      } catch (const Error& e) {
        throw CheckpointError("cannot write " + file.string() + ": " + e.what());
      }
      result.rank_write_seconds = seconds_since(tw);
      result.rank_bytes = shard.bytes;
      mine.a = shard.bytes;
      mine.b = shard.crc;
      mine.c = static_cast<uint64_t>(result.rank_write_seconds * 1e6);
    }
    ckpt::crash_point("after_shards", rank);
  } catch (const std::exception& e) {
    mine.ok = false;
    mine.message = e.what();
  }
  reports = exchange(mine, what + " (after writing the shard files)");
  bool shards_ok = true;
  for (const RankReport& r : reports) shards_ok &= r.ok;
  if (!shards_ok && is_leader) ckpt::remove_quietly(temp);
  ckpt::throw_if_any_failed(reports, what);
  double slowest_write = 0;
  for (const RankReport& r : reports) {
    result.bytes += r.a;
    result.files += r.a > 0 ? 1 : 0;
    slowest_write = std::max(slowest_write, static_cast<double>(r.c) * 1e-6);
  }

  // 3. Rank 0 (every node's first rank with node-local storage) commits: manifest, rename into place, then the
  // pointer.
  const double shards_done = seconds_since(t0);
  const std::vector<RankReport> shard_reports = reports;
  mine = RankReport{};
  if (is_leader) {
    bool committed = false;
    try {
      ckpt::crash_point("before_manifest", rank);
      CheckpointInfo info = ranks.pipelined()
                                ? describe_pipeline(ranks, tag, created, state, extras, layout, shard_reports)
                                : describe(ranks, tag, created, state, extras, shard_reports);
      // The model's buffers: this rank's values (the same on every rank when the program synchronizes them, as
      // zero3::libtorch does).
      const std::vector<ModelBuffer> buffers = engine.buffers();
      if (!buffers.empty()) {
        info.buffers = ckpt::describe_buffers(buffers);
        info.buffers_file = ckpt::write_buffers_file(buffers, temp / ckpt::kBuffersFileName);
        info.buffers_file.rank = rank;
      }
      io::write_file_atomically(temp / ckpt::kManifestName, ckpt::manifest_to_json(info));
      const double manifest_done = seconds_since(t0);
      ckpt::crash_point("before_rename", rank);
      std::optional<fs::path> replaced = ckpt::commit_directory(temp, dir, tag, nonce);
      committed = true;
      const double rename_done = seconds_since(t0);
      ckpt::crash_point("before_latest", rank);
      ckpt::write_latest(dir, tag);
      const double latest_done = seconds_since(t0);
      ckpt::crash_point("before_cleanup", rank);
      if (replaced) ckpt::remove_quietly(*replaced);
      log::debug("save of ", tag, ": shards done at ", shards_done, " s, manifest ", manifest_done, " s, rename ",
                 rename_done, " s, latest ", latest_done, " s, old copy removed ", seconds_since(t0), " s");
    } catch (const std::exception& e) {
      mine.ok = false;
      mine.message = e.what();
      if (!committed) ckpt::remove_quietly(temp);
    }
  }
  reports = exchange(mine, what + " (committing)");
  ckpt::throw_if_any_failed(reports, what);
  result.seconds = seconds_since(t0);
  log::info_rank0("saved checkpoint ", result.path.string(), ": ", result.files, " files, ", result.bytes,
                  " bytes; shards written in ", slowest_write, " s (",
                  slowest_write > 0 ? result.bytes / slowest_write / 1e6 : 0.0, " MB/s over all ranks), ",
                  result.seconds, " s in all",
                  nodes > 1 ? " (node-local storage: " + std::to_string(nodes) + " nodes)" : "");
  return result;
}

}  // namespace ckpt

SavedCheckpoint save_checkpoint(Engine& engine, const fs::path& dir, const std::string& tag,
                                const CheckpointExtras& extras) {
  return ckpt::save_checkpoint_on_node(engine, dir, tag, extras, ckpt::host_name());
}

}  // namespace zero3

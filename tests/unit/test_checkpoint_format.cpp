// The pieces of the checkpoint format that need no engine: CRC-32C (known values, chunking, combining), the
// manifest's round trip and validation, the resharding read plan, and the export name rules.
#include <gtest/gtest.h>

#include <random>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/export_names.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/reshard.hpp"
#include "zero3/error.hpp"

namespace zero3::ckpt {
namespace {

// The textbook bitwise CRC-32C, as the reference for the table and hardware paths.
uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c_update(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_update(0, "", 0), 0u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c_update(0, zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c_update(0, ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32c, ChunkedAndCombinedEqualOnePass) {
  std::mt19937_64 rng(5);
  std::vector<unsigned char> data(100'003);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const uint32_t whole = crc_bitwise(data.data(), data.size());
  EXPECT_EQ(crc32c_update(0, data.data(), data.size()), whole) << "hardware: " << crc32c_hardware();
  // Odd split points, through the three-lane loop and the tails.
  for (size_t cut : {0ul, 1ul, 7ul, 4096ul, 12289ul, 50'000ul, 100'003ul}) {
    uint32_t c = crc32c_update(0, data.data(), cut);
    c = crc32c_update(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
    const uint32_t a = crc32c_update(0, data.data(), cut);
    const uint32_t b = crc32c_update(0, data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc32c_combine(a, b, data.size() - cut), whole) << cut;
  }
  // Unaligned starts.
  for (size_t off = 1; off < 9; ++off) {
    EXPECT_EQ(crc32c_update(0, data.data() + off, 40'000), crc_bitwise(data.data() + off, 40'000)) << off;
  }
}

CheckpointInfo sample_info() {
  CheckpointInfo info;
  info.tag = "step7";
  info.format_version = kFormatVersion;
  info.zero3_version = "0.1.0";
  info.created = "2025-01-01T00:00:00Z";
  info.world_size = 4;
  info.stage = 3;
  info.config_json = R"({"zero_optimization": {"stage": 3}})";
  info.training_state = {14, 7, 1, 6, 32768.0, 7, 3, 2};
  info.extras = {{"epoch", "2"}, {"rng", "[1, 2, 3]"}};
  CheckpointUnit u;
  u.name = "layers.0";
  u.dtype = DType::bf16;
  u.numel = 10;
  u.slice_numel = 3;
  u.padded_numel = 12;
  u.params = {{"a", "layers.0.a", {2, 3}, DType::bf16, 0, 6}, {"b", "layers.0.b", {4}, DType::bf16, 6, 4}};
  info.units.push_back(u);
  for (int r = 0; r < 4; ++r) {
    CheckpointFile f;
    f.name = rank_file_name(r, 4);
    f.rank = r;
    f.bytes = 1000 + static_cast<uint64_t>(r);
    f.crc32c = 0xdeadbeefu + static_cast<uint32_t>(r);
    f.ranges = {{0, 3 * r, r == 3 ? 1 : 3}};
    info.files.push_back(f);
  }
  return info;
}

TEST(Manifest, RoundTrips) {
  const CheckpointInfo a = sample_info();
  const std::string text = manifest_to_json(a);
  const CheckpointInfo b = manifest_from_json(text, "/ck/step7/manifest.json");
  EXPECT_EQ(b.path, "/ck/step7");
  EXPECT_EQ(b.tag, a.tag);
  EXPECT_EQ(b.world_size, 4);
  EXPECT_EQ(b.training_state.loss_scale, 32768.0);
  EXPECT_EQ(b.training_state.scaler_hysteresis, 2);
  EXPECT_EQ(b.extras, a.extras);
  ASSERT_EQ(b.units.size(), 1u);
  EXPECT_EQ(b.units[0].params[1].full_name, "layers.0.b");
  EXPECT_EQ(b.units[0].dtype, DType::bf16);
  ASSERT_EQ(b.files.size(), 4u);
  EXPECT_EQ(b.files[2].crc32c, 0xdeadbef1u);
  EXPECT_EQ(b.files[3].ranges[0].length, 1);
  EXPECT_NE(b.config_json.find("\"stage\": 3"), std::string::npos);
  EXPECT_EQ(manifest_to_json(b).substr(0, 200), text.substr(0, 200));
}

void expect_invalid(const CheckpointInfo& info, const std::string& part) {
  try {
    manifest_from_json(manifest_to_json(info), "m.json");
    ADD_FAILURE() << "accepted; expected: " << part;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("m.json: ", 0), 0u) << e.what();
  }
}

TEST(Manifest, RefusesInconsistentLayouts) {
  CheckpointInfo shape = sample_info();
  shape.units[0].params[1].numel = 5;
  expect_invalid(shape, "does not match its shape");
  CheckpointInfo offsets = sample_info();
  offsets.units[0].params[1].offset = 7;
  expect_invalid(offsets, "offset 7, expected 6");
  CheckpointInfo escape = sample_info();
  escape.files[0].name = "../../etc/passwd";
  expect_invalid(escape, "not a plain file name");
  CheckpointInfo rank = sample_info();
  rank.files[0].rank = 4;
  expect_invalid(rank, "files[0].rank is 4");
  CheckpointInfo beyond = sample_info();
  beyond.files[3].ranges[0].length = 2;
  expect_invalid(beyond, "files[3].ranges[0].length is 2, expected 1..1");

  std::string text = manifest_to_json(sample_info());
  std::string newer = text;
  newer.replace(newer.find("\"format_version\": 1"), 19, "\"format_version\": 9");
  EXPECT_THROW(manifest_from_json(newer, "m.json"), CheckpointError);
  EXPECT_THROW(manifest_from_json("{\"format\": \"zero3-checkpoint\"}", "m.json"), CheckpointError);
  EXPECT_THROW(manifest_from_json("not json", "m.json"), CheckpointError);
  std::string crc = text;
  crc.replace(crc.find("deadbeef"), 8, "DEADBEEF");
  EXPECT_THROW(manifest_from_json(crc, "m.json"), CheckpointError);
}

// A pipelined run's manifest: 2 stages x 2 data-parallel ranks, each stage's unit partitioned over its 2 ranks.
CheckpointInfo pipelined_info() {
  CheckpointInfo info = sample_info();
  info.format_version = kPipelineFormatVersion;
  info.pipeline_stages = 2;
  info.units.clear();
  info.files.clear();
  CheckpointUnit a;
  a.name = "layers.0";
  a.numel = 10;
  a.slice_numel = 5;
  a.padded_numel = 10;
  a.params = {{"w", "layers.0.w", {2, 5}, DType::f32, 0, 10}};
  CheckpointUnit b;
  b.name = "layers.1";
  b.numel = 7;
  b.slice_numel = 4;
  b.padded_numel = 8;
  b.params = {{"w", "layers.1.w", {7}, DType::f32, 0, 7}};
  b.pipeline_stage = 1;
  info.units = {a, b};
  const CheckpointRange ranges[2][2] = {{{0, 0, 5}, {0, 5, 5}}, {{1, 0, 4}, {1, 4, 3}}};
  for (int s = 0; s < 2; ++s) {
    for (int r = 0; r < 2; ++r) {
      CheckpointFile f;
      f.name = stage_rank_file_name(s, 2, r, 2);
      f.rank = r;
      f.pipeline_stage = s;
      f.bytes = 100;
      f.ranges = {ranges[s][r]};
      info.files.push_back(f);
    }
  }
  return info;
}

TEST(Manifest, PipelinedRoundTripsAndChecksEachStagesPartition) {
  const CheckpointInfo a = pipelined_info();
  const std::string text = manifest_to_json(a);
  EXPECT_NE(text.find("\"format_version\": 2"), std::string::npos);
  EXPECT_NE(text.find("\"data_parallel_size\": 2"), std::string::npos);
  const CheckpointInfo b = manifest_from_json(text, "/ck/p/manifest.json");
  EXPECT_EQ(b.pipeline_stages, 2);
  EXPECT_EQ(b.data_parallel_size(), 2);
  EXPECT_EQ(b.units[1].pipeline_stage, 1);
  EXPECT_EQ(b.files[3].name, "stage-01-of-02-rank-00001-of-00002.safetensors");
  EXPECT_EQ(b.files[3].pipeline_stage, 1);
  EXPECT_EQ(b.files[3].rank, 1);
  const size_t config_at = text.find("\"config\"");
  EXPECT_EQ(manifest_to_json(b).substr(0, config_at), text.substr(0, config_at));
  // A unit read back whole: its stage's two files.
  const std::vector<RangeRead> reads = plan_reads(b, 1, 0, 7);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 2);
  EXPECT_EQ(reads[1].file, 3);

  CheckpointInfo world_partition = pipelined_info();
  world_partition.units[1].slice_numel = 2;
  world_partition.units[1].padded_numel = 8;
  expect_invalid(world_partition, "a partition over 2 of pipeline stage 1's 2 ranks");
  CheckpointInfo renamed = pipelined_info();
  renamed.files[1].name = rank_file_name(1, 4);
  expect_invalid(renamed, "rank 1 of pipeline stage 0's 2 writes 'stage-00-of-02-rank-00001-of-00002.safetensors'");
  CheckpointInfo swapped = pipelined_info();
  std::swap(swapped.files[1].ranges, swapped.files[2].ranges);
  expect_invalid(swapped, "but rank 1 of pipeline stage 0's 2 at stage 3 holds elements [5, 10) of unit 'layers.0'");
  CheckpointInfo missing = pipelined_info();
  missing.files.pop_back();
  expect_invalid(missing, "world_size 4 as 2 pipeline stages x data_parallel_size 2 at stage 3 means 4 shard file(s)");
  std::string three = text;
  three.replace(three.find("\"stages\": 2"), 11, "\"stages\": 3");
  EXPECT_THROW(manifest_from_json(three, "m.json"), CheckpointError);
  std::string version1 = text;
  version1.replace(version1.find("\"format_version\": 2"), 19, "\"format_version\": 1");
  EXPECT_THROW(manifest_from_json(version1, "m.json"), CheckpointError);
}

// The files' ranges must be the partition of the run that saved: ceil(numel / world_size) elements per rank, rank r
// from r * slice, padding not stored; rank 0 alone at stage 0. Whatever breaks it is named.
TEST(Manifest, RangesMustBeTheSavingRunsPartition) {
  CheckpointInfo gap = sample_info();
  gap.files[1].ranges[0] = {0, 4, 2};
  expect_invalid(gap,
                 "files[1] (rank-00001-of-00004.safetensors): ranges[0] is elements [4, 6) of unit 'layers.0', "
                 "but rank 1 of 4 at stage 3 holds elements [3, 6) of unit 'layers.0' there");
  CheckpointInfo overlap = sample_info();
  overlap.files[1].ranges[0].begin = 2;
  expect_invalid(overlap, "ranges[0] is elements [2, 5)");
  // Two files' ranges swapped: every unit is still covered exactly once, but the bytes of each file are the other
  // rank's slice.
  CheckpointInfo swapped = sample_info();
  std::swap(swapped.files[0].ranges, swapped.files[1].ranges);
  expect_invalid(swapped,
                 "files[0] (rank-00000-of-00004.safetensors): ranges[0] is elements [3, 6) of unit "
                 "'layers.0', but rank 0 of 4 at stage 3 holds elements [0, 3)");
  expect_invalid(swapped, "swapped between files");
  // world_size rewritten: 5 ranks of 10 elements write 5 files.
  CheckpointInfo world = sample_info();
  world.world_size = 5;
  expect_invalid(world,
                 "world_size 5 at stage 3 means 5 shard file(s), one per rank that holds a slice, but files "
                 "lists 4 (ranks 0, 1, 2, 3)");
  CheckpointInfo sizes = sample_info();
  sizes.units[0].slice_numel = 4;
  sizes.units[0].padded_numel = 16;
  expect_invalid(sizes,
                 "slice_numel 4 and padded_numel 16 do not follow from numel 10 and a partition over 4 of world_size 4 "
                 "ranks (expected ceil(10 / 4) = 3 and 12)");
  CheckpointInfo name = sample_info();
  name.files[2].name = rank_file_name(2, 8);
  expect_invalid(name, "rank 2 of 4 writes 'rank-00002-of-00004.safetensors', not 'rank-00002-of-00008.safetensors'");
  CheckpointInfo twice = sample_info();
  twice.files[1].rank = 0;
  expect_invalid(twice, "files[1] (rank-00001-of-00004.safetensors): a second file of rank 0");
  CheckpointInfo more = sample_info();
  more.files[0].ranges.push_back({0, 9, 1});
  expect_invalid(more,
                 "ranges[1] is elements [9, 10) of unit 'layers.0', but rank 0 of 4 at stage 3 holds nothing more");
  CheckpointInfo stage0 = sample_info();
  stage0.stage = 0;
  expect_invalid(stage0, "world_size 4 at stage 0 means 1 shard file(s), one per rank that holds the model (rank 0)");

  // What the writer produces passes: stage 0 (rank 0 holds whole units), and units smaller than the world, of which
  // the last ranks hold nothing (a rank holding nothing at all writes no file).
  CheckpointInfo whole = sample_info();
  whole.stage = 0;
  whole.files.resize(1);
  whole.files[0].ranges = {{0, 0, 10}};
  EXPECT_NO_THROW(manifest_from_json(manifest_to_json(whole), "m.json"));
  CheckpointInfo small = sample_info();
  CheckpointUnit tiny;
  tiny.name = "norm";
  tiny.dtype = DType::f32;
  tiny.numel = 2;
  tiny.slice_numel = 1;
  tiny.padded_numel = 4;
  tiny.params = {{"g", "norm.g", {2}, DType::f32, 0, 2}};
  small.units.push_back(tiny);
  small.files[0].ranges.push_back({1, 0, 1});
  small.files[1].ranges.push_back({1, 1, 1});
  EXPECT_NO_THROW(manifest_from_json(manifest_to_json(small), "m.json"));
  CheckpointInfo idle = sample_info();
  idle.world_size = 8;  // 10 elements: slices of 2, ranks 5-7 hold nothing and write no file
  idle.units[0].slice_numel = 2;
  idle.units[0].padded_numel = 16;
  idle.files.clear();
  for (int r = 0; r < 5; ++r) idle.files.push_back({rank_file_name(r, 8), r, 100, 1, {{0, 2 * r, 2}}});
  EXPECT_NO_THROW(manifest_from_json(manifest_to_json(idle), "m.json"));
}

// The counters move together: every optimizer step is applied or skipped, ends at least one micro-step and at most
// one loss-scaler iteration, and a save ends an accumulation window.
TEST(Manifest, CountersMustAgree) {
  auto with = [](auto change) {
    CheckpointInfo info = sample_info();
    change(info.training_state);
    return info;
  };
  expect_invalid(with([](TrainingState& s) { s.applied_steps = 7; }),
                 "applied_steps (7) + skipped_steps (1) != global_steps (7)");
  expect_invalid(with([](TrainingState& s) { s.micro_steps = 5; }),
                 "training_state.micro_steps 5 is below global_steps 7");
  expect_invalid(with([](TrainingState& s) { s.scaler_iter = 9; }),
                 "training_state.scaler_iter 9 is outside 0..global_steps (7)");
  expect_invalid(with([](TrainingState& s) { s.scaler_last_overflow_iter = 7; }),
                 "training_state.scaler_last_overflow_iter 7 is neither -1 (no overflow) nor an iteration before "
                 "scaler_iter 7");
  expect_invalid(with([](TrainingState& s) { s.loss_scale = 0; }), "training_state.loss_scale");
  expect_invalid(with([](TrainingState& s) { s.scaler_hysteresis = 0; }),
                 "training_state.scaler_hysteresis 0 is below 1");
  CheckpointInfo window = sample_info();
  window.config_json = R"({"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 3}})";
  expect_invalid(window, "training_state.micro_steps 14 is not a multiple of config.gradient_accumulation_steps 4");
  window.config_json = R"({"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3}})";
  EXPECT_NO_THROW(manifest_from_json(manifest_to_json(window), "m.json"));
}

TEST(Reshard, ReadsCoverANewSliceAcrossOldFiles) {
  const CheckpointInfo info = sample_info();  // 10 elements saved by 4 ranks as [0,3) [3,6) [6,9) [9,10)
  // World 3: slices of 4. Rank 1 holds [4, 8): the end of file 1 and the start of file 2.
  auto reads = plan_reads(info, 0, 4, 4);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 1);
  EXPECT_EQ(reads[0].src_offset, 1);
  EXPECT_EQ(reads[0].dst_offset, 0);
  EXPECT_EQ(reads[0].count, 2);
  EXPECT_EQ(reads[1].file, 2);
  EXPECT_EQ(reads[1].src_offset, 0);
  EXPECT_EQ(reads[1].dst_offset, 2);
  EXPECT_EQ(reads[1].count, 2);
  // Rank 2 holds [8, 12): two elements, then padding that nothing reads.
  reads = plan_reads(info, 0, 8, 4);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 2);
  EXPECT_EQ(reads[0].count, 1);
  EXPECT_EQ(reads[1].file, 3);
  EXPECT_EQ(reads[1].dst_offset, 1);
  EXPECT_EQ(reads[0].count + reads[1].count, 2);
  // World 1: everything, in order.
  reads = plan_reads(info, 0, 0, 10);
  ASSERT_EQ(reads.size(), 4u);
  int64_t covered = 0;
  for (const RangeRead& r : reads) {
    EXPECT_EQ(r.dst_offset, covered);
    covered += r.count;
  }
  EXPECT_EQ(covered, 10);
  // A slice entirely in the padding reads nothing.
  EXPECT_TRUE(plan_reads(info, 0, 10, 2).empty());
}

TEST(ExportNames, AutomaticRuleAndNameMap) {
  const std::vector<NamedParam> llama = {
      {"embedding.model.embed_tokens.weight", "model.embed_tokens.weight"},
      {"layers.0.model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"},
      {"head.lm_head.weight", "lm_head.weight"}};
  ExportOptions o;
  EXPECT_EQ(export_names(llama, o)[1], "model.layers.0.mlp.up_proj.weight");
  o.naming = TensorNaming::full;
  EXPECT_EQ(export_names(llama, o)[2], "head.lm_head.weight");

  const std::vector<NamedParam> mlp = {{"fc1.w", "w"}, {"fc1.b", "b"}, {"fc2.w", "w"}};
  o.naming = TensorNaming::automatic;
  EXPECT_EQ(export_names(mlp, o), (std::vector<std::string>{"fc1.w", "fc1.b", "fc2.w"}));
  o.name_map = {{"fc2.w", "proj.weight"}};
  EXPECT_EQ(export_names(mlp, o)[2], "proj.weight");
  o.naming = TensorNaming::local;
  EXPECT_THROW(export_names(mlp, o), CheckpointError);
  o.naming = TensorNaming::full;
  o.name_map = {{"fc9.w", "x"}};
  EXPECT_THROW(export_names(mlp, o), CheckpointError);
  o.name_map = {{"fc2.w", "fc1.w"}};
  EXPECT_THROW(export_names(mlp, o), CheckpointError);
}

}  // namespace
}  // namespace zero3::ckpt

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
  info.training_state = {14, 7, 1, 6, 32768.0, 12, 3, 2};
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
  CheckpointInfo gap = sample_info();
  gap.files[1].ranges[0].begin = 4;
  gap.files[1].ranges[0].length = 2;
  expect_invalid(gap, "leave a gap at element 3");
  CheckpointInfo overlap = sample_info();
  overlap.files[1].ranges[0].begin = 2;
  expect_invalid(overlap, "overlap");
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
  CheckpointInfo counters = sample_info();
  counters.training_state.applied_steps = 7;
  expect_invalid(counters, "applied_steps");

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

// Sharded safetensors models: shard planning like save_pretrained, the sharded writer and its index, the
// sharded reader over directories / index files / single files, its errors, and the f32 range readers the
// engine's pretrained init rule uses.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "safetensors_test_files.hpp"
#include "zero3/dtype.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

using namespace zero3;
using namespace zero3::safetensors;
using zero3::test::read_bytes;
using zero3::test::safetensors_bytes;
using zero3::test::ScratchDir;
using zero3::test::write_bytes;

namespace {

template <typename E, typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    std::string what = e.what();
    for (std::string_view p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

// A model of `layers` layers, each a (4, 8) f32 weight, a (8) bf16 bias, plus an (8, 8) f16 head.
std::vector<TensorDecl> small_model(int layers) {
  std::vector<TensorDecl> d;
  for (int l = 0; l < layers; ++l) {
    d.push_back({"layers." + std::to_string(l) + ".w", Dtype::f32, {4, 8}});  // 128 bytes
    d.push_back({"layers." + std::to_string(l) + ".b", Dtype::bf16, {8}});    // 16 bytes
  }
  d.push_back({"head", Dtype::f16, {8, 8}});  // 128 bytes
  return d;
}

float value_of(size_t tensor, int64_t i) { return static_cast<float>(tensor) * 100.0f + static_cast<float>(i) * 0.25f; }

void write_model(ShardedSafetensorsWriter& w, const std::vector<TensorDecl>& decls) {
  for (size_t t = 0; t < decls.size(); ++t) {
    const int64_t n = decls[t].shape.size() == 1 ? decls[t].shape[0] : decls[t].shape[0] * decls[t].shape[1];
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = value_of(t, i);
    // Two chunks per tensor, as a unit-by-unit consolidator would give them.
    w.write_from_f32(decls[t].name, v.data(), n / 2);
    w.write_from_f32(decls[t].name, v.data() + n / 2, n - n / 2);
  }
  w.finish();
}

}  // namespace

TEST(SafetensorsShards, PlanFollowsSavePretrained) {
  auto decls = small_model(3);  // sizes 128,16, 128,16, 128,16, 128 = 560 bytes
  auto one = plan_shards(decls, 10'000);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].file_name, "model.safetensors");
  EXPECT_EQ(one[0].data_bytes, 560u);

  auto plan = plan_shards(decls, 300);
  // 128+16+128 = 272 fits, +16 = 288 fits, +128 > 300: next shard ...
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].file_name, "model-00001-of-00002.safetensors");
  EXPECT_EQ(plan[1].file_name, "model-00002-of-00002.safetensors");
  EXPECT_EQ(plan[0].tensors, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan[0].data_bytes, 288u);
  EXPECT_EQ(plan[1].tensors, (std::vector<size_t>{4, 5, 6}));

  // A tensor bigger than the limit gets a shard of its own.
  auto big = plan_shards({{"a", Dtype::u8, {10}}, {"huge", Dtype::u8, {1000}}, {"b", Dtype::u8, {10}}}, 100, "w");
  ASSERT_EQ(big.size(), 3u);
  EXPECT_EQ(big[1].tensors, (std::vector<size_t>{1}));
  EXPECT_EQ(big[2].file_name, "w-00003-of-00003.safetensors");
  EXPECT_THROW(plan_shards(decls, 0), InvalidArgument);
}

TEST(SafetensorsShards, ParseSizeLikeTransformers) {
  EXPECT_EQ(parse_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_size("5GiB"), 5ull << 30);
  EXPECT_EQ(parse_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_size("10KB"), 10'000u);
  EXPECT_EQ(parse_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_size("2 mib"), 2u << 20);
  EXPECT_EQ(parse_size("12345"), 12345u);
  EXPECT_EQ(parse_size("7B"), 7u);
  expect_error<InvalidArgument>([] { parse_size("GB"); }, {"'GB'", "number"});
  expect_error<InvalidArgument>([] { parse_size("5PB"); }, {"'5PB'", "unknown unit"});
  expect_error<InvalidArgument>([] { parse_size("-5GB"); }, {"'-5GB'"});
}

TEST(SafetensorsShards, ShardedWriteThenReadBack) {
  ScratchDir dir;
  const auto decls = small_model(3);
  {
    ShardedSafetensorsWriter w(dir.path(), decls, 300);
    EXPECT_EQ(w.shards().size(), 2u);
    write_model(w, decls);
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00002-of-00002.safetensors"));
  const auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 560);
  EXPECT_EQ(index["weight_map"]["layers.0.w"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["head"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"].size(), decls.size());

  // The directory, the index file and the shards all open.
  for (const auto& source : {dir.path(), dir / "model.safetensors.index.json"}) {
    ShardedSafetensorsReader r(source);
    EXPECT_EQ(r.shard_count(), 2u);
    EXPECT_EQ(r.names().size(), decls.size());
    EXPECT_EQ(r.shard_of("layers.2.w").path().filename(), "model-00002-of-00002.safetensors");
    EXPECT_EQ(r.shard(0).metadata().at("format"), "pt");
    for (size_t t = 0; t < decls.size(); ++t) {
      const TensorInfo& info = r.tensor(decls[t].name);
      EXPECT_EQ(info.dtype, decls[t].dtype);
      EXPECT_EQ(info.shape, decls[t].shape);
      std::vector<float> got(static_cast<size_t>(info.numel()));
      r.read_as_f32(decls[t].name, 0, info.numel(), got.data());
      for (int64_t i = 0; i < info.numel(); ++i) {
        const float x = value_of(t, i);
        const float want = decls[t].dtype == Dtype::bf16  ? bf16_to_f32(f32_to_bf16(x))
                           : decls[t].dtype == Dtype::f16 ? f16_to_f32(f32_to_f16(x))
                                                          : x;
        ASSERT_EQ(got[i], want) << decls[t].name << "[" << i << "]";
      }
    }
  }
}

TEST(SafetensorsShards, ResavingWithFewerShardsRemovesStaleFiles) {
  ScratchDir dir;
  auto decls = small_model(3);
  {
    ShardedSafetensorsWriter w(dir.path(), decls, 150);  // several shards
    EXPECT_GT(w.shards().size(), 2u);
    write_model(w, decls);
  }
  write_bytes(dir / "other-00001-of-00002.safetensors", "not ours");
  write_bytes(dir / "config.json", "{}");
  {
    ShardedSafetensorsWriter w(dir.path(), decls, 1'000'000);  // one file now
    write_model(w, decls);
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors", "other-00001-of-00002.safetensors"}));
  ShardedSafetensorsReader r(dir.path());
  EXPECT_EQ(r.shard_count(), 1u);
  EXPECT_EQ(r.source().filename(), "model.safetensors");
}

TEST(SafetensorsShards, WriterChecksOrderAcrossShards) {
  ScratchDir dir;
  auto decls = small_model(2);
  ShardedSafetensorsWriter w(dir.path(), decls, 150);
  std::vector<float> v(32, 1.0f);
  w.write_from_f32("layers.0.w", v.data(), 32);
  // layers.0.b (shard 1) was never written: moving on to a later shard must say so.
  expect_error<InvalidArgument>([&] { w.write_from_f32("layers.1.w", v.data(), 32); },
                                {"'layers.0.b' has 0 of its 16 bytes"});
  expect_error<IoError>([&] { ShardedSafetensorsWriter(dir / "absent", decls, 100); }, {"absent", "does not exist"});
}

TEST(SafetensorsShards, ReaderErrorsNameTheIndexShardAndTensor) {
  ScratchDir dir;
  auto decls = small_model(2);
  {
    ShardedSafetensorsWriter w(dir.path(), decls, 150);
    write_model(w, decls);
  }
  const auto index_path = dir / "model.safetensors.index.json";
  const std::string good = read_bytes(index_path);
  auto index = nlohmann::json::parse(good);
  const std::string second = index["weight_map"]["layers.1.w"];

  // A missing shard.
  std::filesystem::rename(dir / second, dir / "moved");
  expect_error<IoError>(
      [&] { ShardedSafetensorsReader r(dir.path()); },
      {"model.safetensors.index.json", "shard '" + second + "'", "e.g. 'layers.1.b'", "No such file"});
  std::filesystem::rename(dir / "moved", dir / second);

  // A tensor the index puts in the wrong shard.
  auto wrong = index;
  wrong["weight_map"]["head"] = index["weight_map"]["layers.0.w"];
  write_bytes(index_path, wrong.dump());
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir.path()); },
                        {"weight_map puts tensor 'head' in", "has no such tensor"});

  // Paths that leave the directory.
  auto escape = index;
  escape["weight_map"]["head"] = "../model-00001-of-00003.safetensors";
  write_bytes(index_path, escape.dump());
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir.path()); }, {"'head'", "not a file name inside"});
  escape["weight_map"]["head"] = "/etc/passwd";
  write_bytes(index_path, escape.dump());
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir.path()); }, {"/etc/passwd", "not a file name inside"});

  // Malformed indexes.
  write_bytes(index_path, R"({"metadata":{}})");
  expect_error<IoError>([&] { ShardedSafetensorsReader r(index_path); }, {"no \"weight_map\""});
  write_bytes(index_path, R"({"weight_map":{"head":3}})");
  expect_error<IoError>([&] { ShardedSafetensorsReader r(index_path); }, {"weight_map['head']", "not a string"});
  write_bytes(index_path, R"({"weight_map":{"a":"x","a":"y"}})");
  expect_error<IoError>([&] { ShardedSafetensorsReader r(index_path); }, {"'a' twice"});
  write_bytes(index_path, R"({"weight_map":)");
  expect_error<IoError>([&] { ShardedSafetensorsReader r(index_path); }, {"not valid JSON"});
  write_bytes(index_path, "[]");
  expect_error<IoError>([&] { ShardedSafetensorsReader r(index_path); }, {"not a JSON object"});

  // Unknown names.
  write_bytes(index_path, good);
  ShardedSafetensorsReader r(dir.path());
  expect_error<IoError>([&] { r.tensor("layers.9.w"); }, {"model.safetensors.index.json", "no tensor 'layers.9.w'"});
  EXPECT_FALSE(r.contains("layers.9.w"));
  EXPECT_EQ(r.find("layers.9.w"), nullptr);
}

TEST(SafetensorsShards, DirectoryResolution) {
  ScratchDir dir;
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir.path()); }, {"found no model.safetensors"});
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir / "nothing"); }, {"nothing", "no such file"});
  write_bytes(dir / "a.safetensors", safetensors_bytes("{}", ""));
  EXPECT_EQ(ShardedSafetensorsReader(dir.path()).source().filename(), "a.safetensors");  // the only one
  write_bytes(dir / "b.safetensors", safetensors_bytes("{}", ""));
  expect_error<IoError>([&] { ShardedSafetensorsReader r(dir.path()); }, {"2 *.safetensors files"});
  write_bytes(dir / "model.safetensors", safetensors_bytes("{}", ""));
  EXPECT_EQ(ShardedSafetensorsReader(dir.path()).source().filename(), "model.safetensors");
}

TEST(SafetensorsShards, F32RangeReaderReadsEachRanksSlice) {
  ScratchDir dir;
  auto decls = small_model(2);
  {
    ShardedSafetensorsWriter w(dir.path(), decls, 150);
    write_model(w, decls);
  }
  auto model = std::make_shared<const ShardedSafetensorsReader>(dir.path());
  // The engine asks for each rank's slice of the flattened parameter: 3 ranks over 32 elements.
  F32RangeReader read = make_f32_reader(model, "layers.1.w", 32);
  model.reset();       // the reader keeps the model alive
  const size_t t = 2;  // index of layers.1.w in decls
  for (int64_t rank = 0; rank < 3; ++rank) {
    const int64_t begin = rank * 11, end = std::min<int64_t>(32, begin + 11);
    std::vector<float> out(static_cast<size_t>(end - begin));
    read(begin, end, out.data());
    for (int64_t i = begin; i < end; ++i) EXPECT_EQ(out[i - begin], value_of(t, i));
  }
  auto again = std::make_shared<const ShardedSafetensorsReader>(dir.path());
  expect_error<InvalidArgument>([&] { make_f32_reader(again, "layers.1.w", 33); },
                                {"'layers.1.w'", "32 elements", "[4, 8]", "has 33"});
  expect_error<IoError>([&] { make_f32_reader(again, "layers.1.weight"); }, {"no tensor 'layers.1.weight'"});
  expect_error<InvalidArgument>([&] { make_f32_reader(nullptr, "x"); }, {"no model"});
}

// Pretrained weights holding NaN or Inf would make every step's gradients non-finite (every step skipped, the run
// training nothing): the reader refuses them, naming the tensor, the file and the first bad element, in each
// stored dtype.
TEST(SafetensorsShards, F32RangeReaderRefusesNonFiniteWeights) {
  ScratchDir dir;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float w[6] = {0.5f, -1.0f, 2.0f, nan, 3.0f, nan};
  const uint16_t b[4] = {f32_to_bf16(1.0f), f32_to_bf16(-inf), f32_to_bf16(2.0f), f32_to_bf16(inf)};
  {
    SafetensorsWriter out(dir / "model.safetensors", {{"w", Dtype::f32, {2, 3}}, {"b", Dtype::bf16, {4}}});
    out.write("w", w, sizeof w);
    out.write("b", b, sizeof b);
    out.finish();
  }
  auto model = std::make_shared<const ShardedSafetensorsReader>(dir.path());
  const std::string file = (dir / "model.safetensors").string();
  std::vector<float> v(6);
  const F32RangeReader read_w = make_f32_reader(model, "w", 6);
  read_w(0, 3, v.data());  // a rank whose slice is clean loads it
  EXPECT_EQ(v[2], 2.0f);
  expect_error<InvalidArgument>([&] { read_w(2, 6, v.data()); },
                                {"tensor 'w' of " + file + " [2, 3] holds 2 non-finite value(s) in elements [2, 6)",
                                 "the first at element 3 (NaN)", "cannot start from NaN or Inf"});
  const F32RangeReader read_b = make_f32_reader(model, "b", 4);
  expect_error<InvalidArgument>([&] { read_b(0, 4, v.data()); }, {"tensor 'b'", "the first at element 1 (-Inf)"});
  expect_error<InvalidArgument>([&] { read_b(2, 4, v.data()); }, {"the first at element 3 (+Inf)"});
}

TEST(SafetensorsShards, F32RangeReaderRefusesIntegerTensors) {
  ScratchDir dir;
  {
    SafetensorsWriter w(dir / "model.safetensors", {{"ids", Dtype::i64, {2}}});
    const int64_t v[2] = {1, 2};
    w.write("ids", v, sizeof v);
    w.finish();
  }
  auto model = std::make_shared<const ShardedSafetensorsReader>(dir.path());
  expect_error<Unsupported>([&] { make_f32_reader(model, "ids"); }, {"'ids'", "I64"});
}

// Files written by Hugging Face's own safetensors package (tests/data/safetensors/make_fixtures.py) read
// by our reader: every dtype, a scalar, an empty tensor, metadata, and a two-shard model with its index.
// The expected values are the fixture script's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

using namespace zero3;
using namespace zero3::safetensors;

namespace {

std::filesystem::path data_dir() {
  const char* src = std::getenv("ZERO3_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "tests" / "data" / "safetensors";
}

template <typename T>
std::vector<T> read_all(const SafetensorsReader& r, const std::string& name) {
  const TensorInfo& t = r.tensor(name);
  EXPECT_EQ(static_cast<uint64_t>(dtype_bits(t.dtype) / 8), sizeof(T)) << name;
  std::vector<T> out(static_cast<size_t>(t.numel()));
  r.read_range(name, 0, t.numel(), out.data());
  return out;
}

}  // namespace

TEST(SafetensorsPython, ReadsEveryDtypeWrittenByPython) {
  SafetensorsReader r(data_dir() / "python_all_dtypes.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("writer"), "python safetensors");
  EXPECT_EQ(r.tensors().size(), 12u);
  EXPECT_EQ(r.header_bytes() % 8, 0u);

  const TensorInfo& w = r.tensor("weights.f32");
  EXPECT_EQ(w.dtype, Dtype::f32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> f(6);
  r.read_as_f32("weights.f32", 0, 6, f.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f[i], i * 0.5f - 1.25f);
  r.read_as_f32("weights.f32", 4, 6, f.data());
  EXPECT_EQ(f[0], 0.75f);
  EXPECT_EQ(f[1], 1.25f);

  r.read_as_f32("weights.f16", 0, 4, f.data());
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.5f);
  EXPECT_EQ(f[2], 65504.0f);
  EXPECT_EQ(f[3], std::ldexp(1.0f, -24));  // the smallest f16 subnormal

  r.read_as_f32("weights.bf16", 0, 3, f.data());
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -3.0f);
  EXPECT_EQ(f[2], bf16_to_f32(f32_to_bf16(1e-3f)));  // Python rounded to nearest even too
  EXPECT_NE(f[2], 1e-3f);

  r.read_as_f32("weights.f64", 0, 2, f.data());
  EXPECT_EQ(f[0], 0.1f);
  EXPECT_EQ(f[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(read_all<double>(r, "weights.f64"), (std::vector<double>{0.1, -1e300}));

  EXPECT_EQ(read_all<int64_t>(r, "ids.i64"), (std::vector<int64_t>{-1, int64_t{1} << 40, 7}));
  EXPECT_EQ(read_all<int32_t>(r, "ids.i32"), (std::vector<int32_t>{-5, 123456}));
  EXPECT_EQ(read_all<int16_t>(r, "ids.i16"), (std::vector<int16_t>{-300, 300}));
  EXPECT_EQ(read_all<int8_t>(r, "ids.i8"), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(read_all<uint8_t>(r, "ids.u8"), (std::vector<uint8_t>{0, 128, 255}));
  EXPECT_EQ(r.tensor("mask.bool").dtype, Dtype::boolean);
  EXPECT_EQ(read_all<uint8_t>(r, "mask.bool"), (std::vector<uint8_t>{1, 0, 1}));

  EXPECT_TRUE(r.tensor("scalar").shape.empty());
  float s = 0;
  r.read_as_f32("scalar", 0, 1, &s);
  EXPECT_EQ(s, 3.25f);
  EXPECT_EQ(r.tensor("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(r.tensor("empty").nbytes(), 0u);
}

TEST(SafetensorsPython, ReadsAShardedModelWithItsIndex) {
  ShardedSafetensorsReader r(data_dir() / "sharded");
  EXPECT_EQ(r.shard_count(), 2u);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"head", "layer.0.b", "layer.0.w", "layer.1.w"}));
  EXPECT_EQ(r.shard_of("layer.1.w").path().filename(), "model-00002-of-00002.safetensors");

  auto model =
      std::make_shared<const ShardedSafetensorsReader>(data_dir() / "sharded" / "model.safetensors.index.json");
  float v[16];
  make_f32_reader(model, "layer.0.w", 16)(0, 16, v);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(v[i], i / 8.0f);
  make_f32_reader(model, "layer.1.w", 16)(5, 9, v);
  for (int i = 5; i < 9; ++i) EXPECT_EQ(v[i - 5], i * -0.25f);
  make_f32_reader(model, "layer.0.b", 4)(1, 4, v);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_EQ(v[2], 4.0f);
  make_f32_reader(model, "head", 8)(0, 8, v);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v[i], static_cast<float>(i - 4));
}

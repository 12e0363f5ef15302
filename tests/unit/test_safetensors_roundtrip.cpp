// Safetensors writer -> reader round trips: every dtype, scalars and empty tensors, header padding,
// element-range reads, f32 conversion, chunked streaming writes, and the atomic publish of the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>

#include "io/atomic_file.hpp"
#include "safetensors_test_files.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

using namespace zero3;
using namespace zero3::safetensors;
using zero3::test::read_bytes;
using zero3::test::ScratchDir;
using zero3::test::write_bytes;

namespace {

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(i * 37 + seed * 11 + 5);
  return out;
}

// Asserts that `fn` throws E and that its message contains every one of `parts`.
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

size_t count_files(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

TEST(SafetensorsDtype, NamesAndWidthsRoundTrip) {
  const Dtype all[] = {Dtype::boolean, Dtype::u8,      Dtype::i8,          Dtype::u16,         Dtype::i16,
                       Dtype::u32,     Dtype::i32,     Dtype::u64,         Dtype::i64,         Dtype::f16,
                       Dtype::bf16,    Dtype::f32,     Dtype::f64,         Dtype::c64,         Dtype::f8_e4m3,
                       Dtype::f8_e5m2, Dtype::f8_e8m0, Dtype::f8_e4m3fnuz, Dtype::f8_e5m2fnuz, Dtype::f4,
                       Dtype::f6_e2m3, Dtype::f6_e3m2};
  for (Dtype t : all) EXPECT_EQ(dtype_from_name(dtype_name(t)), t) << dtype_name(t);
  EXPECT_EQ(dtype_name(Dtype::boolean), "BOOL");
  EXPECT_EQ(dtype_bits(Dtype::bf16), 16);
  EXPECT_EQ(dtype_bits(Dtype::f4), 4);
  EXPECT_EQ(dtype_bits(Dtype::c64), 64);
  EXPECT_FALSE(dtype_from_name("f32").has_value());  // names are case-sensitive
  EXPECT_FALSE(dtype_from_name("F128").has_value());
  EXPECT_EQ(from_dtype(zero3::DType::bf16), Dtype::bf16);
  EXPECT_EQ(to_dtype(Dtype::f16), zero3::DType::f16);
  EXPECT_FALSE(to_dtype(Dtype::i64).has_value());
}

TEST(SafetensorsRoundTrip, EveryDtype) {
  ScratchDir dir;
  struct Case {
    Dtype dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Case> cases = {
      {Dtype::boolean, {3}}, {Dtype::u8, {5}},          {Dtype::i8, {2, 2}},       {Dtype::u16, {3}},
      {Dtype::i16, {1, 3}},  {Dtype::u32, {2}},         {Dtype::i32, {2, 3}},      {Dtype::u64, {2}},
      {Dtype::i64, {3}},     {Dtype::f16, {7}},         {Dtype::bf16, {2, 5}},     {Dtype::f32, {3, 1, 2}},
      {Dtype::f64, {3}},     {Dtype::c64, {2}},         {Dtype::f8_e4m3, {4}},     {Dtype::f8_e5m2, {4}},
      {Dtype::f8_e8m0, {2}}, {Dtype::f8_e4m3fnuz, {3}}, {Dtype::f8_e5m2fnuz, {3}}, {Dtype::f4, {2, 4}},
      {Dtype::f6_e2m3, {4}}, {Dtype::f6_e3m2, {8}},
  };
  std::vector<TensorDecl> decls;
  for (size_t i = 0; i < cases.size(); ++i) {
    decls.push_back(
        {"t" + std::to_string(i) + "." + std::string(dtype_name(cases[i].dtype)), cases[i].dtype, cases[i].shape});
  }
  const auto path = dir / "all.safetensors";
  {
    SafetensorsWriter w(path, decls, {{"format", "pt"}, {"note", "every dtype"}});
    for (size_t i = 0; i < decls.size(); ++i) {
      auto bytes = pattern(tensor_bytes(decls[i]), static_cast<unsigned>(i));
      w.write(decls[i].name, bytes.data(), bytes.size());
    }
    w.finish();
    EXPECT_EQ(std::filesystem::file_size(path), w.file_size());
  }
  SafetensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), decls.size());
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("note"), "every dtype");
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorInfo& t = r.tensors()[i];  // file order is declaration order
    EXPECT_EQ(t.name, decls[i].name);
    EXPECT_EQ(t.dtype, decls[i].dtype);
    EXPECT_EQ(t.shape, decls[i].shape);
    EXPECT_EQ(t.data_begin, expected_begin);
    expected_begin = t.data_end;
    std::vector<unsigned char> got(t.nbytes());
    r.read_range(t.name, 0, t.numel(), got.data());
    EXPECT_EQ(got, pattern(t.nbytes(), static_cast<unsigned>(i))) << t.name;
  }
  EXPECT_EQ(r.data_offset() + expected_begin, r.file_size());
}

TEST(SafetensorsRoundTrip, ScalarsAndZeroSizeTensors) {
  ScratchDir dir;
  const auto path = dir / "edge.safetensors";
  const float scalar = 2.5f;
  const float after[3] = {1, 2, 3};
  {
    SafetensorsWriter w(path, {{"scalar", Dtype::f32, {}},
                               {"empty1", Dtype::f32, {0}},
                               {"empty3", Dtype::bf16, {3, 0, 2}},
                               {"after", Dtype::f32, {3}},
                               {"empty_last", Dtype::i64, {0, 9}}});
    w.write("scalar", &scalar, 4);
    // Empty tensors need no write; one may still be given zero bytes.
    w.write("empty3", nullptr, 0);
    w.write("after", after, sizeof after);
    w.finish();
  }
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensor("scalar").numel(), 1);
  EXPECT_TRUE(r.tensor("scalar").shape.empty());
  EXPECT_EQ(r.tensor("empty3").numel(), 0);
  EXPECT_EQ(r.tensor("empty3").shape, (std::vector<int64_t>{3, 0, 2}));
  EXPECT_EQ(r.tensor("empty_last").nbytes(), 0u);
  float s = 0;
  r.read_as_f32("scalar", 0, 1, &s);
  EXPECT_EQ(s, 2.5f);
  r.read_range("empty1", 0, 0, nullptr);
  float got[3];
  r.read_as_f32("after", 0, 3, got);
  EXPECT_EQ(std::memcmp(got, after, sizeof after), 0);
}

TEST(SafetensorsRoundTrip, HeaderIsPaddedWithSpacesTo8Bytes) {
  ScratchDir dir;
  // Names of several lengths give every remainder mod 8.
  for (int len = 1; len <= 8; ++len) {
    const auto path = dir / ("pad" + std::to_string(len) + ".safetensors");
    {
      SafetensorsWriter w(path, {{std::string(len, 'a'), Dtype::u8, {1}}}, {});
      const unsigned char b = 7;
      w.write(std::string(len, 'a'), &b, 1);
      w.finish();
    }
    SafetensorsReader r(path);
    EXPECT_EQ(r.header_bytes() % 8, 0u);
    EXPECT_EQ(r.data_offset() % 8, 0u);
    const std::string bytes = read_bytes(path);
    const std::string header = bytes.substr(8, r.header_bytes());
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    EXPECT_EQ(header.find("__metadata__"), std::string::npos);  // empty metadata is left out
  }
}

TEST(SafetensorsRoundTrip, DefaultMetadataIsFormatPt) {
  ScratchDir dir;
  const auto path = dir / "m.safetensors";
  SafetensorsWriter w(path, {});
  w.finish();
  SafetensorsReader r(path);
  EXPECT_TRUE(r.tensors().empty());
  EXPECT_EQ(r.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST(SafetensorsRoundTrip, ReadRangeReadsExactlyTheSlice) {
  ScratchDir dir;
  const auto path = dir / "slices.safetensors";
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), -100.0f);
  std::vector<int16_t> shorts(33);
  std::iota(shorts.begin(), shorts.end(), int16_t{-7});
  {
    SafetensorsWriter w(path, {{"head", Dtype::i16, {3, 11}}, {"w", Dtype::f32, {10, 100}}});
    w.write("head", shorts.data(), shorts.size() * 2);
    w.write("w", values.data(), values.size() * 4);
    w.finish();
  }
  SafetensorsReader r(path);
  const std::pair<int64_t, int64_t> ranges[] = {{0, 1000}, {0, 1}, {999, 1000}, {250, 500}, {333, 334}, {7, 7}};
  for (auto [b, e] : ranges) {
    std::vector<float> got(static_cast<size_t>(e - b));
    r.read_range("w", b, e, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), values.begin() + b)) << b << ".." << e;
  }
  int16_t s[5];
  r.read_range("head", 28, 33, s);
  EXPECT_TRUE(std::equal(s, s + 5, shorts.begin() + 28));

  expect_error<InvalidArgument>([&] { r.read_range("w", 990, 1001, values.data()); },
                                {"[990, 1001)", "'w'", "1000 elements", "slices.safetensors"});
  expect_error<InvalidArgument>([&] { r.read_range("w", -1, 3, values.data()); }, {"[-1, 3)"});
  expect_error<InvalidArgument>([&] { r.read_range("w", 5, 4, values.data()); }, {"[5, 4)"});
  expect_error<IoError>([&] { r.read_range("nope", 0, 1, values.data()); }, {"no tensor 'nope'", "slices"});
  expect_error<Unsupported>([&] { r.read_as_f32("head", 0, 1, values.data()); }, {"I16", "'head'"});
}

TEST(SafetensorsRoundTrip, ReadAsF32ConvertsAcrossChunks) {
  ScratchDir dir;
  const auto path = dir / "conv.safetensors";
  // 700k elements: the 2-byte types span two 1 MiB staging chunks, f64 six of them.
  const int64_t n = 700'000;
  std::vector<float> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(std::sin(0.001 * i) * 1000.0 + 1e-3 * i);
  {
    SafetensorsWriter w(
        path, {{"bf", Dtype::bf16, {n}}, {"h", Dtype::f16, {n}}, {"s", Dtype::f32, {n}}, {"d", Dtype::f64, {n}}});
    // Given in uneven pieces, as a consolidator streaming units would.
    for (const char* name : {"bf", "h", "s", "d"}) {
      int64_t done = 0, step = 1;
      while (done < n) {
        const int64_t m = std::min(step, n - done);
        w.write_from_f32(name, src.data() + done, m);
        done += m;
        step = step * 3 + 1;
      }
    }
    w.finish();
  }
  SafetensorsReader r(path);
  std::vector<float> got(static_cast<size_t>(n));
  for (const char* name : {"bf", "h", "s", "d"}) {
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {123'457, 654'321}, {n - 3, n}}) {
      r.read_as_f32(name, b, e, got.data());
      for (int64_t i = b; i < e; ++i) {
        const float x = src[i];
        const float want = name[0] == 'b'   ? bf16_to_f32(f32_to_bf16(x))
                           : name[0] == 'h' ? f16_to_f32(f32_to_f16(x))
                                            : x;
        ASSERT_EQ(got[i - b], want) << name << " element " << i;
      }
    }
  }
}

TEST(SafetensorsRoundTrip, F64ToF32RoundsAndOverflowsToInfinity) {
  ScratchDir dir;
  const auto path = dir / "f64.safetensors";
  const double flt_max = std::numeric_limits<float>::max();
  const double halfway = 0x1.ffffffp127;  // between FLT_MAX and 2^128: ties to even, i.e. to infinity
  const double d[] = {0.1, -1e300, 1e300, flt_max, std::nan(""), -0.0, halfway, std::nextafter(halfway, 0.0)};
  {
    SafetensorsWriter w(path, {{"d", Dtype::f64, {8}}});
    w.write("d", d, sizeof d);
    w.finish();
  }
  SafetensorsReader r(path);
  float f[8];
  r.read_as_f32("d", 0, 8, f);
  EXPECT_EQ(f[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[7], std::numeric_limits<float>::max());
  EXPECT_EQ(f[0], 0.1f);
  EXPECT_EQ(f[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[3], std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isnan(f[4]));
  EXPECT_TRUE(std::signbit(f[5]));
}

TEST(SafetensorsRoundTrip, SubByteTypesReadOnByteBoundaries) {
  ScratchDir dir;
  const auto path = dir / "f4.safetensors";
  const unsigned char packed[4] = {0x10, 0x32, 0x54, 0x76};  // eight 4-bit values
  {
    SafetensorsWriter w(path, {{"q", Dtype::f4, {8}}});
    w.write("q", packed, 4);
    w.finish();
  }
  SafetensorsReader r(path);
  unsigned char got[2];
  r.read_range("q", 2, 6, got);
  EXPECT_EQ(got[0], 0x32);
  EXPECT_EQ(got[1], 0x54);
  expect_error<InvalidArgument>([&] { r.read_range("q", 1, 4, got); }, {"byte boundaries", "F4"});
  expect_error<InvalidArgument>(
      [&] {
        SafetensorsWriter(dir / "odd.safetensors", {{"q", Dtype::f4, {3}}});
      },
      {"'q'", "whole bytes"});
}

TEST(SafetensorsRoundTrip, ConcurrentReadsFromThreads) {
  ScratchDir dir;
  const auto path = dir / "mt.safetensors";
  const int64_t n = 1 << 16;
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), 0.0f);
  {
    SafetensorsWriter w(path, {{"x", Dtype::f32, {n}}});
    w.write_from_f32("x", values.data(), n);
    w.finish();
  }
  const SafetensorsReader r(path);
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> got(n / 8);
      for (int rep = 0; rep < 20; ++rep) {
        r.read_as_f32("x", t * (n / 8), (t + 1) * (n / 8), got.data());
        for (int64_t i = 0; i < n / 8; ++i) bad[t] += got[i] != values[t * (n / 8) + i];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

TEST(SafetensorsWriter, WritesMustFollowDeclarationOrderAndSizes) {
  ScratchDir dir;
  const auto path = dir / "order.safetensors";
  SafetensorsWriter w(path, {{"a", Dtype::f32, {4}}, {"b", Dtype::f32, {2}}, {"c", Dtype::u8, {3}}});
  const float f[4] = {1, 2, 3, 4};
  w.write("a", f, 8);
  expect_error<InvalidArgument>([&] { w.write("b", f, 8); }, {"'b'", "'a' has 8 of its 16 bytes", "order.safetensors"});
  expect_error<InvalidArgument>([&] { w.write("a", f, 12); }, {"'a'", "16 bytes", "20 were given"});
  expect_error<InvalidArgument>([&] { w.write("zzz", f, 4); }, {"'zzz' was not declared"});
  w.write("a", f + 2, 8);
  w.write("b", f, 8);
  expect_error<InvalidArgument>([&] { w.write("a", f, 4); }, {"'a' is written after tensor 'b'"});
  expect_error<InvalidArgument>([&] { w.finish(); }, {"'c' has 0 of its 3 bytes"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsWriter, DeclarationsAreValidated) {
  ScratchDir dir;
  const auto path = dir / "bad.safetensors";
  expect_error<InvalidArgument>(
      [&] {
        SafetensorsWriter(path, {{"x", Dtype::f32, {1}}, {"x", Dtype::f32, {2}}});
      },
      {"'x' is declared twice"});
  expect_error<InvalidArgument>([&] { SafetensorsWriter(path, {{"__metadata__", Dtype::f32, {1}}}); }, {"reserved"});
  expect_error<InvalidArgument>(
      [&] {
        SafetensorsWriter(path, {{"neg", Dtype::f32, {2, -1}}});
      },
      {"'neg'", "[2, -1]", "negative"});
  expect_error<InvalidArgument>(
      [&] {
        SafetensorsWriter(path, {{"big", Dtype::f64, {1LL << 40, 1LL << 30}}});
      },
      {"'big'", "overflows"});
  expect_error<InvalidArgument>(
      [&] {
        SafetensorsWriter(path, {{"bad\xff", Dtype::f32, {1}}});
      },
      {"not valid UTF-8", "\\xff"});
  expect_error<InvalidArgument>([&] { SafetensorsWriter(path, {{"", Dtype::f32, {1}}}); }, {"empty name"});
  expect_error<InvalidArgument>([&] { SafetensorsWriter(path, {}, {{"k", "\xc0\x80"}}); }, {"__metadata__", "UTF-8"});
  EXPECT_EQ(count_files(dir.path()), 0u);
}

TEST(SafetensorsWriter, UnfinishedWriterLeavesTheOldFileAndNoTemporaries) {
  ScratchDir dir;
  const auto path = dir / "model.safetensors";
  write_bytes(path, "old content");
  {
    SafetensorsWriter w(path, {{"a", Dtype::u8, {4}}});
    const unsigned char b[2] = {1, 2};
    w.write("a", b, 2);
    EXPECT_EQ(count_files(dir.path()), 2u);  // the old file and the hidden temporary
  }                                          // destroyed without finish(), as when an exception unwinds a save
  EXPECT_EQ(read_bytes(path), "old content");
  EXPECT_EQ(count_files(dir.path()), 1u);
  {
    SafetensorsWriter w(path, {{"a", Dtype::u8, {4}}});
    const unsigned char b[4] = {1, 2, 3, 4};
    w.write("a", b, 4);
    w.finish();
  }
  EXPECT_EQ(SafetensorsReader(path).tensor("a").nbytes(), 4u);
  EXPECT_EQ(count_files(dir.path()), 1u);
}

TEST(SafetensorsWriter, MissingDirectoryIsAnIoError) {
  ScratchDir dir;
  expect_error<IoError>([&] { SafetensorsWriter(dir / "no/such/dir/x.safetensors", {}); },
                        {"no/such/dir", "No such file or directory"});
}

TEST(AtomicFile, CommitPublishesAndAbandonRemoves) {
  ScratchDir dir;
  const auto path = dir / "f.bin";
  {
    io::AtomicFile f(path);
    f.write("hello ", 6);
    f.write("world", 5);
    f.pwrite("W", 1, 6);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_TRUE(std::filesystem::exists(f.temp_path()));
    EXPECT_EQ(f.temp_path().parent_path(), dir.path());
    f.commit();
    EXPECT_TRUE(f.committed());
  }
  EXPECT_EQ(read_bytes(path), "hello World");
  {
    io::AtomicFile f(path);
    f.write("replacement", 11);
    std::filesystem::path temp = f.temp_path();
    f.abandon();
    EXPECT_FALSE(std::filesystem::exists(temp));
  }
  EXPECT_EQ(read_bytes(path), "hello World");
  io::write_file_atomically(path, "third");
  EXPECT_EQ(read_bytes(path), "third");
  EXPECT_EQ(count_files(dir.path()), 1u);
  expect_error<IoError>([&] { io::AtomicFile(dir / "missing" / "f.bin"); }, {"missing", "f.bin"});
}

TEST(AtomicFile, DurableRenameMovesDirectories) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "staging");
  write_bytes(dir / "staging" / "shard0", "x");
  io::durable_rename(dir / "staging", dir / "final");
  EXPECT_EQ(read_bytes(dir / "final" / "shard0"), "x");
  expect_error<IoError>([&] { io::durable_rename(dir / "nothing", dir / "final2"); }, {"rename", "nothing"});
}

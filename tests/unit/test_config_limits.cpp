// The config reader's bounds: input it cannot use is a ConfigError naming the key or the file, never a
// crash, a hang or a message the size of the input. Nesting, numbers out of range, NUL bytes, long names,
// many unknown keys, files that are too large, directories, devices and FIFOs, and "auto" sizes that do
// not fit in 64 bits. test_config_cli.cpp runs the same inputs through `zero3 config check`.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "zero3/config.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

// The ConfigError of parsing `text` (or of resolving it with `in`); fails the test when there is none.
std::string error_of(const std::string& text, const ResolveInputs* in = nullptr) {
  try {
    Config c = parse_config(text, "limits.json");
    if (in) resolve(c, *in);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for: " << text.substr(0, 200);
  return "";
}

std::string load_error(const std::string& path, uint64_t max_bytes = kMaxConfigBytes) {
  try {
    load_config(path, max_bytes);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for " << path;
  return "";
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

std::string nested(const std::string& open, const std::string& inner, const std::string& close, int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += inner;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "zero3_limits_" + name; }

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

}  // namespace

TEST(ConfigLimits, DeepNestingIsAnErrorNamingTheKeyAndTheDepth) {
  // Printing this value for its error message once recursed 100,000 levels deep (SIGSEGV).
  std::string m = error_of(R"({"train_batch_size": )" + nested("[", "", "]", 100000) + "}");
  EXPECT_HAS(m, "train_batch_size[0][0]");
  EXPECT_HAS(m, "nested more than 256 levels");
  EXPECT_HAS(m, "(in limits.json)");
  EXPECT_LT(m.size(), 400u) << m;
  m = error_of(nested(R"({"a": )", "1", "}", 100000));
  EXPECT_HAS(m, "a.a.a");
  EXPECT_HAS(m, "levels");
  // 256 levels, the top-level object included, are read (here an unknown top-level key: a warning).
  Config c = parse_config(R"({"x": )" + nested("[", "", "]", 255) + "}", "limits.json");
  EXPECT_EQ(c.warnings.size(), 1u);
  m = error_of(R"({"x": )" + nested("[", "", "]", 256) + "}");
  EXPECT_HAS(m, "x[0]");
  EXPECT_HAS(m, "256");
}

TEST(ConfigLimits, ValuesInMessagesAreBounded) {
  // A wrong value of any depth or size is quoted in at most 80 characters.
  std::string m = error_of(R"({"train_batch_size": )" + nested("[", "1", "]", 200) + "}");
  EXPECT_HAS(m, "train_batch_size: got [[[[[[[[[...]]]]]]]]], expected an integer");
  std::string big = "[";
  for (int i = 0; i < 1000000; ++i) big += i ? ",1" : "1";
  m = error_of(R"({"train_batch_size": )" + big + "]}");
  EXPECT_HAS(m, "got [1,1,1,");
  EXPECT_HAS(m, "...");
  EXPECT_LT(m.size(), 200u);
  m = error_of(R"({"zero_optimization": {"stage": ")" + std::string(1000000, 'x') + R"("}})");
  EXPECT_HAS(m, "zero_optimization.stage: got \"xxx");
  EXPECT_LT(m.size(), 200u);
}

TEST(ConfigLimits, KeyNamesInMessagesAreBoundedAndPrintable) {
  std::string m = error_of(R"({"zero_optimization": {")" + std::string(1000000, 'k') + R"(": 1}})");
  EXPECT_HAS(m, "zero_optimization.kkkk");
  EXPECT_HAS(m, "...: unknown key in zero_optimization");
  EXPECT_LT(m.size(), 2000u);
  // Control characters (a NUL would cut the message where it is printed) are written \u00XX.
  m = error_of(R"({"zero_optimization": {"\u0000\n\u001b[31m": 1}})");
  EXPECT_HAS(m, R"(zero_optimization.\u0000\u000a\u001b[31m: unknown key)");
  // A long name costs no edit distance: the suggestion is skipped, not computed over a million bytes.
  auto start = std::chrono::steady_clock::now();
  m = error_of(R"({"aio": {")" + std::string(4000000, 'q') + R"(": 1}})");
  EXPECT_HAS(m, "known keys");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));  // was hours
  // A duplicate key of any length is named, shortened.
  m = error_of(R"({")" + std::string(5000, 'd') + R"(": 1, ")" + std::string(5000, 'd') + R"(": 2})");
  EXPECT_HAS(m, "ddd...: key given twice");
  EXPECT_LT(m.size(), 300u);
}

TEST(ConfigLimits, ManyUnknownTopLevelKeysAreCounted) {
  std::string text = "{";
  for (int i = 0; i < 100000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  Config c = parse_config(text + "}", "limits.json");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "\"k0\"; \"k1\"; \"k10\"");  // in the order of the parsed object, sorted
  EXPECT_HAS(c.warnings[0], "\"k10004\"; and 99990 more");
  EXPECT_LT(c.warnings[0].size(), 400u);
}

TEST(ConfigLimits, NumbersOutOfRangeNameTheKey) {
  // Once "unexpected error: number overflow", naming nothing.
  std::string m = error_of(R"({"train_batch_size": 1e400})");
  EXPECT_HAS(m, "train_batch_size: the number 1e400 is out of range");
  EXPECT_HAS(m, "(in limits.json)");
  m = error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, -1e999]}}})");
  EXPECT_HAS(m, "optimizer.params.betas[1]: the number -1e999 is out of range");
  m = error_of(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": )" + std::string(400, '9') + "}}");
  EXPECT_HAS(m, "zero_optimization.reduce_bucket_size: the number 9999");
  EXPECT_LT(m.size(), 300u);
  m = error_of("1e400");
  EXPECT_HAS(m, "limits.json: the number 1e400 is out of range");
  // Integers beyond 64 bits that are finite doubles are range errors of the key, as before.
  m = error_of(R"({"zero_optimization": {"sub_group_size": 1e300}})");
  EXPECT_HAS(m, "zero_optimization.sub_group_size: got 1e+300");
}

TEST(ConfigLimits, NulBytesAndEmptyText) {
  std::string text = "{\"train_batch_size\": 8}";
  text += '\0';
  text += "{\"zero_optimization\": {\"stage\": 9}}";
  std::string m = error_of(text);  // nlohmann would stop at the NUL and ignore the rest
  EXPECT_HAS(m, "limits.json:1:24: a NUL byte");
  EXPECT_HAS(error_of(""), "limits.json: no JSON in it");
  EXPECT_HAS(error_of("\n  # a comment\n// another\n"), "no JSON in it");
}

TEST(ConfigLimits, FilesAreReadUpToTheCap) {
  // Exactly at the cap: read. One byte more: refused before reading, naming the file, its size and the cap.
  const std::string path = temp_path("cap.json");
  std::string text = R"({"train_batch_size": 8})";
  write_file(path, text + std::string(1000 - text.size(), ' '));
  EXPECT_EQ(load_config(path, 1000).train_batch_size, 8);
  std::string m = load_error(path, 999);
  EXPECT_HAS(m, path + ": the config file has 1000 bytes, more than the cap of 999 bytes");
  EXPECT_HAS(m, "--max-config-bytes");
  // The default cap is 16 MiB; a sparse file of 17 MiB is refused without reading it.
  ASSERT_EQ(::truncate(path.c_str(), 17 << 20), 0);
  m = load_error(path);
  EXPECT_HAS(m, "has 17825792 bytes (17 MiB), more than the cap of 16777216 bytes (16 MiB)");
  std::remove(path.c_str());
  // An endless device stops at the cap.
  m = load_error("/dev/zero", 1 << 20);
  EXPECT_HAS(m, "/dev/zero: the config file goes on past the cap of 1048576 bytes (1 MiB)");
}

TEST(ConfigLimits, DirectoriesAndMissingFilesAreNamed) {
  std::string m = load_error(::testing::TempDir());
  EXPECT_HAS(m, ": is a directory, expected a DeepSpeed JSON config file");
  m = load_error("/nonexistent/ds_config.json");
  EXPECT_HAS(m, "/nonexistent/ds_config.json: cannot open the config file (No such file or directory)");
}

TEST(ConfigLimits, FifosAndPipesCannotHangTheReader) {
  const std::string fifo = temp_path("fifo_" + std::to_string(::getpid()));
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer: read as empty at once (opening does not wait for one).
  EXPECT_HAS(load_error(fifo), fifo + ": no JSON in it");
  // A writer that holds the FIFO open and writes part of a config, then nothing: refused after the
  // reading time limit (5 s), with what was read.
  int writer = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  ASSERT_EQ(::write(writer, "{\"train", 7), 7);
  std::string m = load_error(fifo);
  EXPECT_HAS(m, fifo + ": no end of input after 5 s (7 bytes read)");
  ::close(writer);
  ::unlink(fifo.c_str());
  // A pipe whose writer wrote the whole config and closed (`zero3 config check <(jq ...)`): read.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(p[1], "{\"train_batch_size\": 4}", 23), 23);
  ::close(p[1]);
  EXPECT_EQ(load_config("/proc/self/fd/" + std::to_string(p[0])).train_batch_size, 4);
  ::close(p[0]);
}

TEST(ConfigLimits, AutoSizesThatDoNotFitIn64BitsNameTheInputs) {
  // hidden_size 2^32 once made reduce_bucket_size 0 and the prefetch bucket -2^63, accepted.
  ResolveInputs in;
  in.hidden_size = int64_t{1} << 32;
  std::string m =
      error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})", &in);
  EXPECT_HAS(m, "zero_optimization.reduce_bucket_size: \"auto\" is hidden_size^2, which for hidden size 4294967296");
  EXPECT_HAS(m, "beyond the largest 64-bit integer");
  m = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}})",
               &in);
  EXPECT_HAS(m, "zero_optimization.stage3_prefetch_bucket_size: \"auto\" is int(0.9 x hidden_size^2)");
  in.hidden_size = int64_t{1} << 61;
  m = error_of(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto"}})",
      &in);
  EXPECT_HAS(m, "\"auto\" is 10 x hidden_size, which for hidden size 2305843009213693952");
  // The largest hidden size whose square fits still resolves, to the exact values.
  in.hidden_size = 3037000499;
  Config c = parse_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  resolve(c, in);
  EXPECT_EQ(c.zero.reduce_bucket_size, int64_t{3037000499} * 3037000499);
  EXPECT_EQ(c.zero.param_persistence_threshold, 30370004990);
  EXPECT_GT(*c.zero.prefetch_bucket_size, 0);
  // Batch sizes: micro batch x accumulation x world size.
  ResolveInputs b;
  b.world_size = int64_t{1} << 40;
  b.micro_batch = int64_t{1} << 20;
  b.grad_accum = 8;
  m = error_of(R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})", &b);
  EXPECT_HAS(m,
             "train_batch_size: train_micro_batch_size_per_gpu 1048576 x gradient_accumulation_steps 8 x world "
             "size 1099511627776 is beyond the largest 64-bit integer");
  const ResolveInputs none;
  m = error_of(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4611686018427387904,
                  "gradient_accumulation_steps": 4})",
               &none);
  EXPECT_HAS(m, "beyond the largest 64-bit integer");
}

// The safetensors reader against hand-made broken files: each rule of the format has a file that breaks
// it, and the error must name the file, the tensor and the rule. None of them may read out of bounds
// (the fuzz target and the sanitizer builds check that part).
#include <gtest/gtest.h>
#include <unistd.h>

#include "safetensors_test_files.hpp"
#include "zero3/error.hpp"
#include "zero3/safetensors.hpp"

using namespace zero3;
using namespace zero3::safetensors;
using zero3::test::le64;
using zero3::test::safetensors_bytes;
using zero3::test::ScratchDir;
using zero3::test::write_bytes;

namespace {

class SafetensorsErrors : public testing::Test {
 protected:
  // Writes `bytes` to bad.safetensors and expects opening it to throw an IoError containing the file name
  // and every one of `parts`.
  void expect_rejected(const std::string& bytes, std::initializer_list<std::string_view> parts) {
    const auto path = dir_ / "bad.safetensors";
    write_bytes(path, bytes);
    try {
      SafetensorsReader r(path);
      ADD_FAILURE() << "accepted a broken file with " << r.tensors().size() << " tensors";
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("bad.safetensors"), std::string::npos) << what;
      for (std::string_view p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
    }
  }

  // A header with one F32 tensor "w" of shape [2] and the given offsets, followed by `data` bytes.
  static std::string one_tensor(const std::string& offsets, size_t data) {
    return safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}",
                             std::string(data, '\x01'));
  }

  ScratchDir dir_;
};

}  // namespace

TEST_F(SafetensorsErrors, ValidMinimalFileIsAccepted) {
  // The baseline the other cases break: it must load.
  const auto path = dir_ / "ok.safetensors";
  write_bytes(path, one_tensor("[0,8]", 8));
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensor("w").nbytes(), 8u);
}

TEST_F(SafetensorsErrors, FileShorterThanTheLengthField) {
  expect_rejected("abc", {"3 bytes", "too short", "8-byte header length"});
  expect_rejected("", {"0 bytes"});
}

TEST_F(SafetensorsErrors, HugeHeaderLength) {
  expect_rejected(le64(100'000'001) + "{}", {"100000001", "100000000-byte limit"});
  expect_rejected(le64(~0ull) + "{}", {"18446744073709551615", "limit"});
}

TEST_F(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  expect_rejected(le64(64) + "{}", {"64 bytes", "only 2 bytes after it", "truncated"});
}

TEST_F(SafetensorsErrors, EmptyHeader) { expect_rejected(le64(0), {"header is empty"}); }

TEST_F(SafetensorsErrors, HeaderNotAnObject) {
  expect_rejected(safetensors_bytes("[1,2]", ""), {"does not start with '{'"});
  expect_rejected(safetensors_bytes(" {}", ""), {"does not start with '{'"});
  expect_rejected(safetensors_bytes("\"str\"", ""), {"does not start with '{'"});
}

TEST_F(SafetensorsErrors, InvalidJson) {
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32",)", ""), {"not valid JSON"});
  expect_rejected(safetensors_bytes(R"({"w" 1})", ""), {"not valid JSON"});
  // Padding must be spaces: NUL bytes after the object are not JSON (and must not hide anything after them).
  expect_rejected(safetensors_bytes(std::string("{}") + std::string(6, '\0'), ""), {"NUL byte at offset 2"});
  expect_rejected(safetensors_bytes(std::string("{}\0{\"hidden\":1}", 13), ""), {"NUL byte at offset 2"});
  // Two JSON values in one header.
  expect_rejected(safetensors_bytes("{}{}", ""), {"not valid JSON"});
}

TEST_F(SafetensorsErrors, InvalidUtf8) {
  expect_rejected(safetensors_bytes("{\"w\xff\":{}}", ""), {"not valid JSON", "UTF-8"});
  // An overlong encoding of '/' inside a string.
  expect_rejected(safetensors_bytes("{\"\xc0\xaf\":{}}", ""), {"not valid JSON"});
}

TEST_F(SafetensorsErrors, DuplicateTensorName) {
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                    R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                    "ab"),
                  {"names 'w' twice", "duplicate"});
}

TEST_F(SafetensorsErrors, DuplicateKeyInsideATensor) {
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", "a"),
                  {"tensor 'w'", "'dtype' twice"});
}

TEST_F(SafetensorsErrors, DuplicateMetadataKey) {
  expect_rejected(safetensors_bytes(R"({"__metadata__":{"a":"1","a":"2"}})", ""), {"__metadata__", "'a' twice"});
}

TEST_F(SafetensorsErrors, MetadataValuesMustBeStrings) {
  expect_rejected(safetensors_bytes(R"({"__metadata__":{"format":"pt","epoch":3}})", ""),
                  {"__metadata__['epoch']", "an integer", "must be a string"});
  expect_rejected(safetensors_bytes(R"({"__metadata__":{"nested":{"a":"b"}}})", ""), {"['nested']", "an object"});
  expect_rejected(safetensors_bytes(R"({"__metadata__":["a"]})", ""), {"__metadata__ is an array"});
}

TEST_F(SafetensorsErrors, NullMetadataMeansNone) {
  const auto path = dir_ / "nullmeta.safetensors";
  write_bytes(path, safetensors_bytes(R"({"__metadata__":null})", ""));
  EXPECT_TRUE(SafetensorsReader(path).metadata().empty());
}

TEST_F(SafetensorsErrors, TensorEntryNotAnObject) {
  expect_rejected(safetensors_bytes(R"({"w":[0,4]})", ""), {"tensor 'w'", "is an array", "expected an object"});
  expect_rejected(safetensors_bytes(R"({"w":"F32"})", ""), {"tensor 'w'", "is a string"});
}

TEST_F(SafetensorsErrors, UnknownDtype) {
  expect_rejected(
      safetensors_bytes(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", std::string(16, 'x')),
      {"tensor 'w'", "unknown dtype 'F128'"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                  {"unknown dtype 'f32'"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                  {"tensor 'w'", "dtype that is an integer"});
}

TEST_F(SafetensorsErrors, MissingFields) {
  expect_rejected(safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                  {"tensor 'w'", "no \"dtype\""});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "xxxx"), {"no \"shape\""});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "xxxx"), {"no \"data_offsets\""});
}

TEST_F(SafetensorsErrors, BadShapeValues) {
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", "xxxx"),
                  {"tensor 'w'", "a negative number", "non-negative integers"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx"),
                  {"a non-integer number"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", "xxxx"),
                  {"a string"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "xxxx"),
                  {"an array"});
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"F32","shape":{"0":1},"data_offsets":[0,4]}})", "xxxx"),
                  {"shape that is an object"});
  expect_rejected(
      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", "xxxx"),
      {"dimension 9223372036854775808", "2^63"});
}

TEST_F(SafetensorsErrors, ShapeOverflow) {
  // 2^32 * 2^32 elements: the element count itself overflows.
  expect_rejected(
      safetensors_bytes(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "xxxx"),
      {"tensor 'w'", "[4294967296, 4294967296]", "overflows 64 bits"});
  // 2^61 elements of F64: the count fits but the byte size does not.
  expect_rejected(
      safetensors_bytes(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", "xxxxxxxx"),
      {"tensor 'w'", "overflows 64 bits"});
}

TEST_F(SafetensorsErrors, SizeDisagreesWithShape) {
  // A header that lies: [2] of F32 is 8 bytes, not 12.
  expect_rejected(one_tensor("[0,12]", 12), {"tensor 'w'", "[0, 12] holding 12 bytes", "[2] of F32 needs 8 bytes"});
  expect_rejected(one_tensor("[0,4]", 4), {"holding 4 bytes", "needs 8 bytes"});
}

TEST_F(SafetensorsErrors, OffsetsEndBeforeBegin) {
  expect_rejected(one_tensor("[8,0]", 8), {"tensor 'w'", "[8, 0]", "end before they begin"});
}

TEST_F(SafetensorsErrors, OffsetsNotAPair) {
  expect_rejected(one_tensor("[0,8,16]", 16), {"tensor 'w'", "more than two data_offsets"});
  expect_rejected(one_tensor("[8]", 8), {"tensor 'w'", "data_offsets has 1 entries"});
  expect_rejected(one_tensor("[]", 8), {"data_offsets has 0 entries"});
  expect_rejected(one_tensor("[-1,7]", 8), {"a negative number"});
  expect_rejected(one_tensor("[0,8.0]", 8), {"a non-integer number"});
  expect_rejected(one_tensor("[0,18446744073709551616]", 8), {"a non-integer number"});  // beyond u64
  expect_rejected(one_tensor("\"0-8\"", 8), {"data_offsets that are a string"});
}

TEST_F(SafetensorsErrors, OverlappingTensors) {
  expect_rejected(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    std::string(12, 'x')),
                  {"tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])"});
  // Two tensors on the very same bytes (a polyglot file).
  expect_rejected(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                                    std::string(8, 'x')),
                  {"overlaps"});
}

TEST_F(SafetensorsErrors, HolesBetweenTensors) {
  expect_rejected(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                    std::string(12, 'x')),
                  {"bytes [4, 8)", "belong to no tensor", "between tensor 'a' and tensor 'b'"});
  expect_rejected(one_tensor("[4,12]", 12), {"bytes [0, 4)", "before tensor 'w'"});
}

TEST_F(SafetensorsErrors, TrailingBytesAfterLastTensor) {
  expect_rejected(one_tensor("[0,8]", 9), {"holds 9 bytes", "cover 8", "last 1 bytes belong to no tensor"});
  expect_rejected(safetensors_bytes("{}", "x"), {"holds 1 bytes", "cover 0"});
}

TEST_F(SafetensorsErrors, TruncatedData) {
  expect_rejected(one_tensor("[0,8]", 5), {"tensor 'w'", "runs past the end of the file", "only 5 bytes", "truncated"});
  // Offsets that point far beyond the file.
  expect_rejected(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                                    R"("x":{"dtype":"U8","shape":[8],"data_offsets":[16,24]}})",
                                    std::string(20, 'x')),
                  {"tensor 'x'", "runs past the end"});
}

TEST_F(SafetensorsErrors, SubByteTensorsMustFillWholeBytes) {
  expect_rejected(safetensors_bytes(R"({"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "xx"),
                  {"tensor 'q'", "3 elements do not fill whole bytes"});
}

TEST_F(SafetensorsErrors, HostileNamesAreEscapedAndCut) {
  const std::string name = "evil\x1b[2J" + std::string(1000, 'n');
  try {
    write_bytes(dir_ / "bad.safetensors",
                safetensors_bytes(
                    "{\"" + std::string("evil\\u001b[2J") + std::string(1000, 'n') + "\":{\"dtype\":\"X\"}}", ""));
    SafetensorsReader r(dir_ / "bad.safetensors");
    ADD_FAILURE();
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\x1b'), std::string::npos);
    EXPECT_NE(what.find("evil\\x1b[2J"), std::string::npos) << what;
    EXPECT_NE(what.find("...'"), std::string::npos);
    EXPECT_LT(what.size(), 600u);
  }
}

TEST_F(SafetensorsErrors, UnknownKeysAreIgnoredEvenDeeplyNested) {
  // The reference implementation ignores keys it does not know; so do we, without recursing.
  std::string deep = std::string(20000, '[') + std::string(20000, ']');
  const auto path = dir_ / "extra.safetensors";
  write_bytes(path, safetensors_bytes(R"({"w":{"extra":)" + deep +
                                          R"(,"dtype":"U8","more":{"a":{"b":1}},"shape":[2],"data_offsets":[0,2]}})",
                                      "ab"));
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensor("w").shape, (std::vector<int64_t>{2}));
}

TEST_F(SafetensorsErrors, DeepNestingElsewhereIsRejectedWithoutRecursion) {
  expect_rejected(safetensors_bytes(R"({"w":)" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
                  {"tensor 'w'", "is an array"});
}

TEST_F(SafetensorsErrors, MissingFileAndDirectory) {
  try {
    SafetensorsReader r(dir_ / "absent.safetensors");
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos);
  }
  try {
    SafetensorsReader r(dir_.path());
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsErrors, FileTruncatedAfterOpenFailsTheRead) {
  // The header was valid when read; the file then shrank under us. The read must fail, not return junk.
  const auto path = dir_ / "shrinks.safetensors";
  write_bytes(path, one_tensor("[0,8]", 8));
  SafetensorsReader r(path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(r.data_offset() + 3)), 0);
  float out[2];
  try {
    r.read_range("w", 0, 2, out);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("shrinks.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("ends after 3"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsParseHeader, WorksOnMemory) {
  std::map<std::string, std::string> meta;
  auto tensors = parse_header(R"({"__metadata__":{"k":"v"},"b":{"dtype":"I8","shape":[1],"data_offsets":[2,3]},)"
                              R"("a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}  )",
                              3, "mem", &meta);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(tensors[1].name, "b");
  EXPECT_EQ(meta.at("k"), "v");
  EXPECT_THROW(parse_header("{}", 1, "mem"), IoError);
}

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/pretokenize.hpp"
#include "data/tokenizer.hpp"

using namespace llama3;

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  for (auto p : pretokenize_llama3(text)) out.emplace_back(p);
  return out;
}

std::string base64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k2 = 18; k2 >= 0; k2 -= 6) out += k[(v >> k2) & 63];
  }
  if (i + 1 == s.size()) {
    uint32_t v = uint8_t(s[i]) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == s.size()) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// A small vocabulary in tiktoken's file format: the 256 bytes, then a few merges in rank order.
std::string tiny_vocab(const std::vector<std::string>& merges) {
  std::string text;
  uint32_t rank = 0;
  for (int b = 0; b < 256; ++b) text += base64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
  for (const auto& m : merges) text += base64(m) + " " + std::to_string(rank++) + "\n";
  return text;
}

}  // namespace

// Expected splits were produced by the pattern itself, run by Python's `regex` module.
TEST(Llama3Pretokenize, MatchesTheReferencePattern) {
  struct Case {
    std::string text;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"Hello, world! It's 2024.", {"Hello", ",", " world", "!", " It", "'s", " ", "202", "4", "."}},
      {"I'LL  do it   now\n\n  next", {"I", "'LL", " ", " do", " it", "  ", " now", "\n\n", " ", " next"}},
      {"12345678 apples", {"123", "456", "78", " apples"}},
      {"don't  you've we'd THEY'RE", {"don", "'t", " ", " you", "'ve", " we", "'d", " THEY", "'RE"}},
      {"  leading and trailing   ", {" ", " leading", " and", " trailing", "   "}},
      {"tab\tsep\r\nline", {"tab", "\tsep", "\r\n", "line"}},
      {"日本語のテキスト、です。", {"日本語のテキスト", "、です", "。"}},
      {"Привет, мир! 123", {"Привет", ",", " мир", "!", " ", "123"}},
      {"emoji 🙂🙂 ok", {"emoji", " 🙂🙂", " ok"}},
      {"a\n \n b", {"a", "\n \n", " b"}},
      {"x == y;; // c\n", {"x", " ==", " y", ";;", " //", " c", "\n"}},
      {"ſs 's", {"ſs", " '", "s"}},
      {"٣٤٥٦ numbers", {"٣٤٥", "٦", " numbers"}},
      {"naïve café", {"naïve", " café"}},
  };
  for (const auto& c : cases) EXPECT_EQ(split(c.text), c.pieces) << c.text;
}

TEST(Llama3Pretokenize, CoversEveryByteOfInvalidUtf8) {
  std::string bad = "ab\xff\xfe cd\xc3";
  std::string joined;
  for (auto p : pretokenize_llama3(bad)) joined += p;
  EXPECT_EQ(joined, bad);
}

TEST(ByteTokenizer, RoundTrip) {
  ByteTokenizer t;
  std::string s = "zero3 \xf0\x9f\x99\x82 \x01";
  auto ids = t.encode(s);
  EXPECT_EQ(ids.size(), s.size());
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_THROW(t.decode({300}), std::runtime_error);
}

TEST(Llama3Tokenizer, MergesByRank) {
  auto tok = Llama3Tokenizer::from_text(tiny_vocab({"th", "the", " t", " the", "he"}), "tiny");
  EXPECT_EQ(tok->vocab_size(), 256u + 5u + 256u);
  EXPECT_EQ(tok->encode("the"), (std::vector<uint32_t>{257}));
  // "thethe" is one piece: t h e t h e -> th e th e -> the the (no "thethe" token).
  EXPECT_EQ(tok->encode("thethe"), (std::vector<uint32_t>{257, 257}));
  // " the" is a token; "he" has a higher rank than "th" so "the" wins over "t"+"he".
  EXPECT_EQ(tok->encode("the the"), (std::vector<uint32_t>{257, 259}));
  // Unmerged bytes stay bytes.
  EXPECT_EQ(tok->encode("xy"), (std::vector<uint32_t>{'x', 'y'}));
  for (std::string s : {"the theory of the thing", "Привет the 日本", "a\n\n  b\t'll"})
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
}

TEST(Llama3Tokenizer, SpecialTokens) {
  auto tok = Llama3Tokenizer::from_text(tiny_vocab({}), "tiny");
  EXPECT_EQ(tok->bos_id(), 256u);
  EXPECT_EQ(tok->eos_id(), 257u);
  EXPECT_EQ(tok->special_id("<|start_header_id|>"), 262u);
  EXPECT_EQ(tok->special_id("<|eot_id|>"), 265u);
  EXPECT_EQ(tok->special_id("<|reserved_special_token_250|>"), 256u + 255u);
  auto ids = tok->encode_with_specials("<|begin_of_text|>hi<|eot_id|>");
  EXPECT_EQ(ids, (std::vector<uint32_t>{256, 'h', 'i', 265}));
  // Plain encode treats the same text as ordinary bytes.
  EXPECT_GT(tok->encode("<|begin_of_text|>").size(), 1u);
  EXPECT_EQ(tok->decode(ids), "<|begin_of_text|>hi<|eot_id|>");
}

TEST(Llama3Tokenizer, MalformedFilesNameTheLine) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      Llama3Tokenizer::from_text(text, "bad.model");
      FAIL() << "accepted: " << needle;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("QQ== 0\nnot-base64! 1\n", "line 2");
  expect_error("QQ== 5\n", "out of order");
  expect_error("QQ==\n", "expected 'base64-token rank'");
  expect_error("QQ== 0\n", "byte 0 has no token");
}

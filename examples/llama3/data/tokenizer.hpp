// Tokenizers of the Llama-3 example.
//
//   ByteTokenizer   ids 0..255 are the bytes of UTF-8 text; no special tokens. The tiny default model's.
//   Llama3Tokenizer Llama-3's byte-level BPE read from its published tiktoken file (tokenizer.model: one
//                   "base64-token rank" pair per line), Llama-3's pre-tokenization, and its 256 special
//                   tokens (<|begin_of_text|> = number of BPE tokens, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llama3 {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  virtual uint32_t vocab_size() const = 0;
  // Token placed between documents when packing; nullopt when the tokenizer has none.
  virtual std::optional<uint32_t> eos_id() const = 0;
  virtual std::optional<uint32_t> bos_id() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint32_t>& ids) const override;
  uint32_t vocab_size() const override { return 256; }
  std::optional<uint32_t> eos_id() const override { return std::nullopt; }
  std::optional<uint32_t> bos_id() const override { return std::nullopt; }
};

class Llama3Tokenizer final : public Tokenizer {
 public:
  // Reads a tiktoken BPE file. Throws std::runtime_error naming the file and line on malformed input.
  static std::unique_ptr<Llama3Tokenizer> from_file(const std::string& path);
  // From the file's text (tests make small vocabularies in this format).
  static std::unique_ptr<Llama3Tokenizer> from_text(std::string_view text, const std::string& source);

  // Plain text: special-token strings in `text` are encoded as ordinary text.
  std::vector<uint32_t> encode(std::string_view text) const override;
  // Like encode, but the listed special-token strings found in `text` become their ids.
  std::vector<uint32_t> encode_with_specials(std::string_view text) const;
  std::string decode(const std::vector<uint32_t>& ids) const override;
  uint32_t vocab_size() const override { return static_cast<uint32_t>(id_to_bytes_.size()); }
  std::optional<uint32_t> eos_id() const override { return special_id("<|end_of_text|>"); }
  std::optional<uint32_t> bos_id() const override { return special_id("<|begin_of_text|>"); }
  std::optional<uint32_t> special_id(std::string_view name) const;

  // Llama-3's special tokens in id order, starting at the number of BPE tokens.
  static std::vector<std::string> special_token_names();

 private:
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;

  std::unordered_map<std::string, uint32_t> ranks_;  // token bytes -> rank (= id)
  std::vector<std::string> id_to_bytes_;             // BPE tokens, then special tokens
  std::unordered_map<std::string, uint32_t> specials_;
};

}  // namespace llama3

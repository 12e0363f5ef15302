// Training data for the Llama-3 example: documents tokenized and packed into fixed-length sequences.
//
// Sources: plain text files, or directories of them (each file one document, sorted by path), or
// pre-tokenized token files: raw little-endian uint32 ids (*.u32, *.bin without a header) or llm.c's
// format (a 256 x int32 header with magic 20240520, version 1 = uint16 ids, version 2 = uint32 ids).
// Documents are joined with the tokenizer's end-of-text id when it has one.
//
// Sequence i holds tokens [i*seq_len, (i+1)*seq_len] (seq_len + 1 tokens): inputs are the first seq_len,
// labels the last seq_len (next-token prediction). Tokens that do not fill a whole sequence are dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace llama3 {

class PackedDataset {
 public:
  // `paths`: files or directories. Throws std::runtime_error naming a path that is missing or empty.
  static PackedDataset from_paths(const std::vector<std::string>& paths, const Tokenizer& tokenizer, int64_t seq_len);
  static PackedDataset from_tokens(std::vector<uint32_t> tokens, int64_t seq_len);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_sequences() const;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  uint32_t max_token() const;

  // inputs and labels each receive seq_len values.
  void sequence(int64_t index, uint32_t* inputs, int32_t* labels) const;

 private:
  std::vector<uint32_t> tokens_;
  int64_t seq_len_ = 0;
};

// Reads a token file (see above). Throws std::runtime_error naming the file.
std::vector<uint32_t> read_token_file(const std::string& path);

// The texts every Debian/Ubuntu machine has: /usr/share/common-licenses.
std::vector<std::string> default_text_paths();

}  // namespace llama3

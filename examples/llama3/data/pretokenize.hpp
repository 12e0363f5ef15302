// Llama-3's pre-tokenization: the split of text into pieces that BPE then encodes one at a time.
// It implements, alternative by alternative, the pattern Llama-3 ships with its tokenizer:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
#pragma once

#include <string_view>
#include <vector>

namespace llama3 {

// The pieces, in order; concatenated they give back `text` exactly.
std::vector<std::string_view> pretokenize_llama3(std::string_view text);

}  // namespace llama3

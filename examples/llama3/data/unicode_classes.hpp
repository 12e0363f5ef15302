// Unicode classes the Llama-3 pre-tokenizer needs, and a forgiving UTF-8 decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace llama3 {

bool is_letter(char32_t cp);      // \p{L}
bool is_number(char32_t cp);      // \p{N}
bool is_whitespace(char32_t cp);  // \s: the Unicode White_Space property

// One code point of a UTF-8 string and the bytes it spans. Invalid bytes decode one at a time as
// U+FFFD-like "other" code points (value 0xFFFFFFFF) so every byte of the input is covered.
struct CodePoint {
  char32_t value;
  size_t begin, end;  // byte range in the input
};

std::vector<CodePoint> decode_utf8(std::string_view text);

}  // namespace llama3

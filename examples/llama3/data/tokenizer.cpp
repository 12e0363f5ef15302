#include "data/tokenizer.hpp"

#include <climits>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/pretokenize.hpp"

namespace llama3 {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::optional<std::string> base64_decode(std::string_view s) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] != '='; ++i) {
    int v = base64_value(s[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  for (; i < s.size(); ++i)
    if (s[i] != '=') return std::nullopt;
  return out;
}

}  // namespace

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id > 255) throw std::runtime_error("byte tokenizer: id " + std::to_string(id) + " is not a byte");
    s.push_back(static_cast<char>(id));
  }
  return s;
}

std::vector<std::string> Llama3Tokenizer::special_token_names() {
  std::vector<std::string> names = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                                    "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; i < 256 - 5; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

std::unique_ptr<Llama3Tokenizer> Llama3Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer file " + path + ": cannot open it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_text(ss.str(), path);
}

std::unique_ptr<Llama3Tokenizer> Llama3Tokenizer::from_text(std::string_view text, const std::string& source) {
  auto tok = std::unique_ptr<Llama3Tokenizer>(new Llama3Tokenizer());
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto fail = [&](const std::string& why) {
      return std::runtime_error("tokenizer file " + source + " line " + std::to_string(line_no) + ": " + why);
    };
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos) throw fail("expected 'base64-token rank'");
    auto bytes = base64_decode(line.substr(0, sp));
    if (!bytes || bytes->empty()) throw fail("the token is not valid base64");
    std::string rank_text(line.substr(sp + 1));
    char* end = nullptr;
    unsigned long long rank = std::strtoull(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0') throw fail("the rank '" + rank_text + "' is not a number");
    if (rank != tok->id_to_bytes_.size())
      throw fail("rank " + rank_text + " out of order: expected " + std::to_string(tok->id_to_bytes_.size()));
    if (!tok->ranks_.emplace(*bytes, static_cast<uint32_t>(rank)).second) throw fail("duplicate token");
    tok->id_to_bytes_.push_back(*bytes);
  }
  // Byte-level BPE must be able to encode every byte.
  for (int b = 0; b < 256; ++b)
    if (!tok->ranks_.count(std::string(1, static_cast<char>(b))))
      throw std::runtime_error("tokenizer file " + source + ": byte " + std::to_string(b) +
                               " has no token; a byte-level BPE vocabulary holds all 256 bytes");
  uint32_t next = static_cast<uint32_t>(tok->id_to_bytes_.size());
  for (const auto& name : special_token_names()) {
    tok->specials_.emplace(name, next++);
    tok->id_to_bytes_.push_back(name);
  }
  return tok;
}

std::optional<uint32_t> Llama3Tokenizer::special_id(std::string_view name) const {
  auto it = specials_.find(std::string(name));
  if (it == specials_.end()) return std::nullopt;
  return it->second;
}

void Llama3Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (auto it = ranks_.find(std::string(piece)); it != ranks_.end()) {
    out.push_back(it->second);
    return;
  }
  // Byte-pair merging: repeatedly merge the adjacent pair whose joined bytes have the lowest rank.
  std::vector<std::string> parts;
  parts.reserve(piece.size());
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    uint32_t best_rank = UINT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks_.find(parts[i] + parts[i + 1]);
      if (it != ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == UINT32_MAX) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const auto& p : parts) out.push_back(ranks_.at(p));
}

std::vector<uint32_t> Llama3Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  for (std::string_view piece : pretokenize_llama3(text)) encode_piece(piece, ids);
  return ids;
}

std::vector<uint32_t> Llama3Tokenizer::encode_with_specials(std::string_view text) const {
  std::vector<uint32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    // The earliest special token at or after pos.
    size_t found = std::string_view::npos;
    uint32_t found_id = 0;
    size_t found_len = 0;
    for (size_t at = text.find("<|", pos); at != std::string_view::npos; at = text.find("<|", at + 1)) {
      size_t close = text.find("|>", at + 2);
      if (close == std::string_view::npos) break;
      auto it = specials_.find(std::string(text.substr(at, close + 2 - at)));
      if (it != specials_.end()) {
        found = at;
        found_id = it->second;
        found_len = close + 2 - at;
        break;
      }
    }
    std::string_view plain = text.substr(pos, found == std::string_view::npos ? std::string_view::npos : found - pos);
    for (std::string_view piece : pretokenize_llama3(plain)) encode_piece(piece, ids);
    if (found == std::string_view::npos) break;
    ids.push_back(found_id);
    pos = found + found_len;
  }
  return ids;
}

std::string Llama3Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string s;
  for (uint32_t id : ids) {
    if (id >= id_to_bytes_.size())
      throw std::runtime_error("Llama-3 tokenizer: id " + std::to_string(id) + " >= vocabulary size " +
                               std::to_string(id_to_bytes_.size()));
    s += id_to_bytes_[id];
  }
  return s;
}

}  // namespace llama3

#include "data/dataset.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace llama3 {
namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("data file " + p.string() + ": cannot open it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_token_file(const fs::path& p) {
  auto ext = p.extension().string();
  return ext == ".u32" || ext == ".bin";
}

// Every regular file under each path, in a stable order.
std::vector<fs::path> expand(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(p, fs::directory_options::follow_directory_symlink))
        if (e.is_regular_file()) found.push_back(e.path());
      if (found.empty()) throw std::runtime_error("data directory " + p + " holds no files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.emplace_back(p);
    } else {
      throw std::runtime_error("data path " + p + " is neither a file nor a directory");
    }
  }
  return files;
}

}  // namespace

std::vector<uint32_t> read_token_file(const std::string& path) {
  std::string raw = read_all(path);
  constexpr int32_t kLlmcMagic = 20240520;
  constexpr size_t kLlmcHeader = 256 * sizeof(int32_t);
  int32_t head[3] = {0, 0, 0};
  if (raw.size() >= kLlmcHeader) std::memcpy(head, raw.data(), sizeof(head));
  std::vector<uint32_t> tokens;
  if (head[0] == kLlmcMagic) {
    if (head[1] != 1 && head[1] != 2)
      throw std::runtime_error("token file " + path + ": llm.c header version " + std::to_string(head[1]) +
                               ", expected 1 (uint16 ids) or 2 (uint32 ids)");
    size_t width = head[1] == 1 ? 2 : 4;
    size_t count = static_cast<uint32_t>(head[2]);
    if (raw.size() < kLlmcHeader + count * width)
      throw std::runtime_error("token file " + path + ": header says " + std::to_string(count) +
                               " tokens but the file is " + std::to_string(raw.size()) + " bytes");
    tokens.resize(count);
    const char* p = raw.data() + kLlmcHeader;
    for (size_t i = 0; i < count; ++i) {
      if (width == 2) {
        uint16_t t;
        std::memcpy(&t, p + 2 * i, 2);
        tokens[i] = t;
      } else {
        std::memcpy(&tokens[i], p + 4 * i, 4);
      }
    }
    return tokens;
  }
  if (raw.size() % 4 != 0)
    throw std::runtime_error("token file " + path + ": " + std::to_string(raw.size()) +
                             " bytes is not a whole number of uint32 ids");
  tokens.resize(raw.size() / 4);
  std::memcpy(tokens.data(), raw.data(), raw.size());
  return tokens;
}

std::vector<std::string> default_text_paths() { return {"/usr/share/common-licenses"}; }

PackedDataset PackedDataset::from_paths(const std::vector<std::string>& paths, const Tokenizer& tokenizer,
                                        int64_t seq_len) {
  std::vector<uint32_t> tokens;
  auto eos = tokenizer.eos_id();
  for (const auto& file : expand(paths)) {
    std::vector<uint32_t> doc = is_token_file(file) ? read_token_file(file) : tokenizer.encode(read_all(file));
    tokens.insert(tokens.end(), doc.begin(), doc.end());
    if (eos && !is_token_file(file)) tokens.push_back(*eos);
  }
  return from_tokens(std::move(tokens), seq_len);
}

PackedDataset PackedDataset::from_tokens(std::vector<uint32_t> tokens, int64_t seq_len) {
  if (seq_len < 1) throw std::runtime_error("sequence length " + std::to_string(seq_len) + " must be >= 1");
  PackedDataset d;
  d.tokens_ = std::move(tokens);
  d.seq_len_ = seq_len;
  if (d.num_sequences() == 0)
    throw std::runtime_error("the data holds " + std::to_string(d.tokens_.size()) +
                             " tokens: not one sequence of " + std::to_string(seq_len + 1));
  return d;
}

int64_t PackedDataset::num_sequences() const {
  if (tokens_.size() < 2) return 0;
  return static_cast<int64_t>((tokens_.size() - 1) / static_cast<size_t>(seq_len_));
}

uint32_t PackedDataset::max_token() const { return tokens_.empty() ? 0 : *std::max_element(tokens_.begin(), tokens_.end()); }

void PackedDataset::sequence(int64_t index, uint32_t* inputs, int32_t* labels) const {
  if (index < 0 || index >= num_sequences())
    throw std::runtime_error("sequence " + std::to_string(index) + " out of range [0, " +
                             std::to_string(num_sequences()) + ")");
  const uint32_t* t = tokens_.data() + index * seq_len_;
  for (int64_t i = 0; i < seq_len_; ++i) {
    inputs[i] = t[i];
    labels[i] = static_cast<int32_t>(t[i + 1]);
  }
}

}  // namespace llama3

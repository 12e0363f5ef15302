// The CIFAR-10 binary format (https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-10 binary version"): files of
// 3073-byte records, one label byte (0-9) then 3072 pixel bytes, the 1024 red values, then the green, then the blue,
// each plane row by row (CHW, 32x32). The published archive's cifar-10-batches-bin/ holds data_batch_1.bin ...
// data_batch_5.bin (10000 records each) and test_batch.bin.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

constexpr int64_t kCifar10Side = 32;
constexpr int64_t kCifar10Pixels = 3 * kCifar10Side * kCifar10Side;
constexpr int64_t kCifar10RecordBytes = 1 + kCifar10Pixels;
constexpr int64_t kCifar10Classes = 10;

// Records of one or more files, as stored: labels [N] int64, pixels [N, 3, 32, 32] uint8.
struct Cifar10Set {
  at::Tensor labels;
  at::Tensor pixels;
  int64_t size() const { return labels.size(0); }
};

// Reads `files` in order. std::runtime_error naming the file when one is missing, empty, not a whole number of
// records, or holds a label outside 0-9 (naming the record).
inline Cifar10Set read_cifar10(const std::vector<std::filesystem::path>& files) {
  std::vector<at::Tensor> parts;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) throw std::runtime_error("cannot read CIFAR-10 file " + file.string());
    const auto bytes = static_cast<int64_t>(in.tellg());
    if (bytes <= 0 || bytes % kCifar10RecordBytes != 0) {
      throw std::runtime_error("CIFAR-10 file " + file.string() + " has " + std::to_string(bytes) +
                               " bytes; expected a positive multiple of " + std::to_string(kCifar10RecordBytes) +
                               " (1 label byte + 3072 pixel bytes per record)");
    }
    at::Tensor records = at::empty({bytes / kCifar10RecordBytes, kCifar10RecordBytes}, at::kByte);
    in.seekg(0);
    if (!in.read(reinterpret_cast<char*>(records.data_ptr<uint8_t>()), bytes)) {
      throw std::runtime_error("short read from CIFAR-10 file " + file.string());
    }
    const at::Tensor bad = (records.select(1, 0) >= kCifar10Classes).nonzero();
    if (bad.numel() > 0) {
      const int64_t record = bad[0][0].item<int64_t>();
      throw std::runtime_error("CIFAR-10 file " + file.string() + ": record " + std::to_string(record) + " has label " +
                               std::to_string(records[record][0].item<int64_t>()) + "; expected 0-9");
    }
    parts.push_back(records);
  }
  if (parts.empty()) throw std::runtime_error("no CIFAR-10 files to read");
  const at::Tensor all = at::cat(parts);
  return {all.select(1, 0).to(at::kLong), all.slice(1, 1).reshape({-1, 3, kCifar10Side, kCifar10Side}).contiguous()};
}

// The training files data_batch_1.bin ... data_batch_5.bin under `dir` (those present, at least one), or
// test_batch.bin. std::runtime_error naming the directory and the file expected otherwise.
inline std::vector<std::filesystem::path> cifar10_files(const std::filesystem::path& dir, bool train) {
  std::vector<std::filesystem::path> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) {
      const auto f = dir / ("data_batch_" + std::to_string(i) + ".bin");
      if (std::filesystem::exists(f)) files.push_back(f);
    }
  } else if (std::filesystem::exists(dir / "test_batch.bin")) {
    files.push_back(dir / "test_batch.bin");
  }
  if (files.empty()) {
    throw std::runtime_error("no CIFAR-10 " + std::string(train ? "data_batch_1.bin" : "test_batch.bin") + " in " +
                             dir.string() +
                             " (the binary version: cifar-10-binary.tar.gz unpacks to cifar-10-batches-bin/)");
  }
  return files;
}

// Images as the seed's transform makes them (ToTensor, then Normalize with mean 0.5 and std 0.5): float in [-1, 1].
inline at::Tensor cifar10_normalize(const at::Tensor& pixels) { return pixels.to(at::kFloat).div_(127.5).sub_(1.0); }

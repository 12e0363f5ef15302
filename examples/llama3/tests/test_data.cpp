#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.hpp"
#include "data/sampler.hpp"

using namespace llama3;

TEST(PackedDataset, PacksNextTokenPairs) {
  std::vector<uint32_t> tokens(23);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  auto d = PackedDataset::from_tokens(tokens, 5);
  EXPECT_EQ(d.num_sequences(), 4);  // (23 - 1) / 5
  uint32_t in[5];
  int32_t lab[5];
  d.sequence(2, in, lab);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(in[i], uint32_t(10 + i));
    EXPECT_EQ(lab[i], 11 + i);
  }
  EXPECT_THROW(d.sequence(4, in, lab), std::runtime_error);
  EXPECT_THROW(PackedDataset::from_tokens({1, 2}, 5), std::runtime_error);
}

TEST(PackedDataset, ReadsTextDirectoriesAndTokenFiles) {
  auto dir = std::filesystem::temp_directory_path() / ("zero3-data-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "b.txt") << "world";
  std::ofstream(dir / "sub" / "a.txt") << "hello ";
  // llm.c format, version 1 (uint16 ids).
  {
    std::ofstream f(dir / "c.bin", std::ios::binary);
    int32_t header[256] = {20240520, 1, 3};
    f.write(reinterpret_cast<char*>(header), sizeof(header));
    uint16_t ids[3] = {7, 8, 9};
    f.write(reinterpret_cast<char*>(ids), sizeof(ids));
  }
  ByteTokenizer bytes;
  auto d = PackedDataset::from_paths({dir.string()}, bytes, 4);
  // Sorted: b.txt, c.bin, sub/a.txt -> "world" 7 8 9 "hello "
  EXPECT_EQ(d.num_tokens(), 5 + 3 + 6);
  uint32_t in[4];
  int32_t lab[4];
  d.sequence(1, in, lab);
  EXPECT_EQ(in[0], uint32_t('d'));
  EXPECT_EQ(in[1], 7u);
  EXPECT_EQ(in[3], 9u);
  EXPECT_EQ(lab[3], 'h');
  EXPECT_THROW(PackedDataset::from_paths({(dir / "missing").string()}, bytes, 4), std::runtime_error);
  std::ofstream(dir / "odd.u32", std::ios::binary) << "abc";
  EXPECT_THROW(read_token_file((dir / "odd.u32").string()), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST(PackedDataset, DefaultTextIsOnEveryDebianMachine) {
  ByteTokenizer bytes;
  auto d = PackedDataset::from_paths(default_text_paths(), bytes, 64);
  EXPECT_GT(d.num_sequences(), 1000);
  EXPECT_LT(d.max_token(), 256u);
}

TEST(DistributedSampler, EpochIsPartitionedAcrossRanksWithoutRepeats) {
  for (int world : {1, 2, 3, 4}) {
    std::multiset<int64_t> seen;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(103, r, world, 42);
      for (int64_t i = 0; i < s.per_rank(); ++i) seen.insert(s.next());
    }
    EXPECT_EQ(seen.size(), size_t(103 / world * world));
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size()) << "world " << world;
  }
}

TEST(DistributedSampler, ResumesMidEpochAndReshufflesPerEpoch) {
  DistributedSampler a(50, 1, 2, 7);
  std::vector<int64_t> first;
  for (int i = 0; i < 40; ++i) first.push_back(a.next());  // crosses into epoch 1 (25 per rank per epoch)
  DistributedSampler b(50, 1, 2, 7);
  for (int i = 0; i < 13; ++i) b.next();
  DistributedSampler c(50, 1, 2, 7);
  c.restore(b.state());
  for (int i = 13; i < 40; ++i) EXPECT_EQ(c.next(), first[i]) << i;
  EXPECT_NE(a.epoch_order(0), a.epoch_order(1));
  EXPECT_THROW(DistributedSampler(3, 0, 4, 1), std::runtime_error);
}

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.hpp"
#include "data/eval_batches.hpp"
#include "data/micro_batches.hpp"
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

// index_at() is next() read in any order and for any rank, across epochs (a pipeline stage reads its micro-batches
// by index); SampledMicroBatches' micro-batch d of rank r is that rank's next() number d x micro .. d x micro + micro
// - 1, the sequences the unpipelined loop reads.
TEST(DistributedSampler, IndexAtIsNextForEveryRank) {
  const int world = 3;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(50, r, world, 9);
    DistributedSampler lookup(50, 0, world, 9);
    std::vector<int64_t> taken;
    for (int i = 0; i < 40; ++i) taken.push_back(s.next());  // 16 per rank per epoch: into epoch 2
    for (int i = 39; i >= 0; --i) EXPECT_EQ(lookup.index_at(i, r), taken[static_cast<size_t>(i)]) << r << " " << i;
  }
  DistributedSampler lookup(50, 0, world, 9);
  EXPECT_THROW(lookup.index_at(0, world), std::runtime_error);
  EXPECT_THROW(lookup.index_at(-1, 0), std::runtime_error);

  std::vector<uint32_t> tokens(50 * 4 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 251);
  const PackedDataset data = PackedDataset::from_tokens(tokens, 4);
  SampledMicroBatches batches(data, world, 9, 2);
  DistributedSampler rank1(data.num_sequences(), 1, world, 9);
  std::vector<int32_t> ids(8), targets(8), want_targets(4);
  std::vector<uint32_t> want_ids(4);
  for (int64_t d = 0; d < 12; ++d) {
    batches.fill(d, 1, ids.data(), targets.data());
    for (int j = 0; j < 2; ++j) {
      data.sequence(rank1.next(), want_ids.data(), want_targets.data());
      for (int t = 0; t < 4; ++t) {
        EXPECT_EQ(ids[static_cast<size_t>(j * 4 + t)], static_cast<int32_t>(want_ids[static_cast<size_t>(t)]));
        EXPECT_EQ(targets[static_cast<size_t>(j * 4 + t)], want_targets[static_cast<size_t>(t)]);
      }
    }
  }
}

// Every sequence exactly once across the ranks per evaluation, the rest padding; the same batch count on every
// rank; max_batches caps it.
TEST(EvalBatches, EverySequenceOnceAcrossRanksThenPadding) {
  std::vector<uint32_t> tokens(71);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  const auto d = PackedDataset::from_tokens(tokens, 5);  // 14 sequences; sequence i starts at token 5i
  ASSERT_EQ(d.num_sequences(), 14);
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::multiset<int32_t> firsts;
    int64_t padded = 0;
    for (int rank = 0; rank < world; ++rank) {
      EvalBatches e(d, rank, world, 2, 0, -100);
      EXPECT_EQ(e.batches(), (14 + 2 * world - 1) / (2 * world));
      EXPECT_EQ(e.sequences(), 14);
      std::vector<int32_t> ids(10), targets(10);
      for (int64_t b = 0; b < e.batches(); ++b) {
        e.fill(b, ids.data(), targets.data());
        for (int j = 0; j < 2; ++j) {
          if (targets[j * 5] == -100) {
            ++padded;
            for (int t = 0; t < 5; ++t) EXPECT_EQ(targets[j * 5 + t], -100);
            continue;
          }
          firsts.insert(ids[j * 5]);
          EXPECT_EQ(targets[j * 5], ids[j * 5] + 1);
        }
      }
    }
    std::multiset<int32_t> want;
    for (int32_t i = 0; i < 14; ++i) want.insert(5 * i);
    EXPECT_EQ(firsts, want);
    EXPECT_EQ(padded, (14 + 2 * world - 1) / (2 * world) * 2 * world - 14);
  }
  EvalBatches capped(d, 1, 2, 2, 2, -100);
  EXPECT_EQ(capped.batches(), 2);
  EXPECT_EQ(capped.sequences(), 8);
  EXPECT_THROW(EvalBatches(d, 2, 2, 2, 0, -100), std::invalid_argument);
  EXPECT_THROW(EvalBatches(d, 0, 1, 0, 0, -100), std::invalid_argument);
}

// EmbeddingGrouping::build (cuda/cuda_ops.hpp), the host half of the deterministic embedding backward: against
// a grouping computed straight from its definition (distinct ids in increasing order, each with its tokens in
// increasing order). Host code only: it runs without a GPU, in every build that has the CUDA path.
#include <gtest/gtest.h>

#if defined(LLAMA3_HAVE_CUDA)

#include <map>
#include <random>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "zero3/error.hpp"

namespace {

using llama3::cuda::EmbeddingGrouping;

void expect_grouping_of(const std::vector<int32_t>& ids) {
  std::map<int32_t, std::vector<int32_t>> by_id;
  for (size_t i = 0; i < ids.size(); ++i) by_id[ids[i]].push_back(static_cast<int32_t>(i));
  std::vector<int32_t> rows, offsets{0}, token_ids;
  for (const auto& [id, tokens] : by_id) {
    rows.push_back(id);
    token_ids.insert(token_ids.end(), tokens.begin(), tokens.end());
    offsets.push_back(static_cast<int32_t>(token_ids.size()));
  }
  const auto g = EmbeddingGrouping::build(ids.data(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(g.rows, rows);
  EXPECT_EQ(g.offsets, offsets);
  EXPECT_EQ(g.token_ids, token_ids);
}

TEST(EmbeddingGrouping, SmallExampleByHand) {
  const std::vector<int32_t> ids{5, 2, 5, 0, 2, 5};
  const auto g = EmbeddingGrouping::build(ids.data(), 6);
  EXPECT_EQ(g.rows, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(g.token_ids, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
}

TEST(EmbeddingGrouping, MatchesTheDefinitionOnRandomIds) {
  std::mt19937 rng(7);
  for (int vocab : {1, 3, 50, 128256}) {
    for (int tokens : {1, 37, 1000}) {
      std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (auto& id : ids) id = dist(rng);
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " tokens " + std::to_string(tokens));
      expect_grouping_of(ids);
    }
  }
}

TEST(EmbeddingGrouping, NoTokensGiveNoRowsAndOneOffset) {
  const auto g = EmbeddingGrouping::build(nullptr, 0);
  EXPECT_TRUE(g.rows.empty());
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0}));
  EXPECT_TRUE(g.token_ids.empty());
}

TEST(EmbeddingGrouping, NegativeIdIsNamed) {
  const std::vector<int32_t> ids{1, -3};
  try {
    EmbeddingGrouping::build(ids.data(), 2);
    FAIL() << "negative id accepted";
  } catch (const zero3::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ids[1] = -3"), std::string::npos) << e.what();
  }
}

}  // namespace

#else

TEST(EmbeddingGrouping, NeedsTheCudaBuild) { GTEST_SKIP() << "this build has no CUDA path (LLAMA3_HAVE_CUDA unset)"; }

#endif

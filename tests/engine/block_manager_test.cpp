#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kiln {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(BlockManager, GrowsReleasesAndFailsWithoutSideEffects) {
  BlockManager bm(8, 4, /*prefix_caching=*/false);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 9).ok());
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(bm.used_blocks(), 3);
  ASSERT_TRUE(bm.grow(a, 12).ok());  // still 3 blocks
  EXPECT_EQ(a.blocks.size(), 3u);
  BlockTable b;
  Status s = bm.grow(b, 24);  // 6 blocks, 5 free
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("5 free of 8"), std::string::npos) << s.message();
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_FALSE(bm.can_grow(b, 24));
  EXPECT_TRUE(bm.can_grow(b, 20));
  bm.release(a);
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(bm.free_blocks(), 8);
}

TEST(BlockManager, LookaheadSlotsAreReserved) {
  BlockManager bm(8, 4, false, /*lookahead_slots=*/3);
  EXPECT_EQ(bm.blocks_for(5), 2);  // 5 + 3 = 8 positions
  EXPECT_EQ(bm.blocks_for(6), 3);
  BlockTable t;
  ASSERT_TRUE(bm.grow(t, 6).ok());
  EXPECT_EQ(t.blocks.size(), 3u);
}

TEST(BlockManager, SharesFullBlocksOfAComputedPrefix) {
  BlockManager bm(16, 4, true);
  const auto tokens = iota_tokens(10);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 10).ok());
  bm.commit(a, tokens, 10);  // blocks 0 and 1 are full; block 2 holds 2 tokens and is not shared
  EXPECT_EQ(a.hashes.size(), 2u);

  BlockTable b;
  EXPECT_EQ(bm.match_prefix(tokens, b), 8);
  ASSERT_EQ(b.blocks.size(), 2u);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_EQ(bm.used_blocks(), 3);  // shared, not copied
  bm.release(a);
  EXPECT_EQ(bm.used_blocks(), 2);  // b still holds the two prefix blocks
  bm.release(b);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.evictable_blocks(), 2);
}

TEST(BlockManager, AlwaysLeavesTheLastTokenToCompute) {
  BlockManager bm(16, 4, true);
  const auto tokens = iota_tokens(8);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 8).ok());
  bm.commit(a, tokens, 8);
  bm.release(a);
  BlockTable b;
  EXPECT_EQ(bm.match_prefix(tokens, b), 4);  // the block with the last token is computed again, privately
  bm.release(b);
}

TEST(BlockManager, HashesChainThroughParents) {
  BlockManager bm(16, 4, true);
  auto tokens = iota_tokens(12);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 12).ok());
  bm.commit(a, tokens, 12);
  bm.release(a);
  // Same second block after a different first block: not the same prefix, so nothing matches.
  auto other = tokens;
  other[0] = 7;
  BlockTable b;
  EXPECT_EQ(bm.match_prefix(other, b), 0);
  EXPECT_TRUE(b.blocks.empty());
  // A divergence in the second block keeps the first.
  other = tokens;
  other[5] = 7;
  EXPECT_EQ(bm.match_prefix(other, b), 4);
  bm.release(b);
}

TEST(BlockManager, EvictsLeastRecentlyReleasedOnlyWhenTheFreeListIsEmpty) {
  BlockManager bm(4, 4, true);
  const auto tokens = iota_tokens(9);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 9).ok());
  bm.commit(a, tokens, 9);  // 2 cached blocks + 1 partial
  bm.release(a);
  EXPECT_EQ(bm.evictable_blocks(), 2);
  EXPECT_EQ(bm.free_blocks(), 4);

  BlockTable other;
  ASSERT_TRUE(bm.grow(other, 8).ok());  // takes the 2 never-cached blocks first
  EXPECT_EQ(bm.evictable_blocks(), 2);
  ASSERT_TRUE(bm.grow(other, 12).ok());  // now evicts one: the tail block of the prefix goes first
  EXPECT_EQ(bm.evictable_blocks(), 1);
  BlockTable c;
  EXPECT_EQ(bm.match_prefix(tokens, c), 4);  // the head block survived
  bm.release(c);
  bm.release(other);
  EXPECT_EQ(bm.free_blocks(), 4);
}

TEST(BlockManager, MatchedBlocksLeaveTheEvictableList) {
  BlockManager bm(3, 4, true);
  const auto tokens = iota_tokens(9);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 9).ok());
  bm.commit(a, tokens, 9);
  bm.release(a);
  BlockTable b;
  EXPECT_EQ(bm.match_prefix(tokens, b), 8);
  EXPECT_EQ(bm.free_blocks(), 1);  // the two matched blocks are referenced again, not evictable
  ASSERT_TRUE(bm.grow(b, 9).ok());
  EXPECT_EQ(bm.free_blocks(), 0);
  BlockTable c;
  EXPECT_FALSE(bm.grow(c, 1).ok());
  bm.release(b);
}

TEST(BlockManager, DuplicatePrefixesComputedTwiceStayConsistent) {
  BlockManager bm(8, 4, true);
  const auto tokens = iota_tokens(8);
  BlockTable a, b;
  ASSERT_TRUE(bm.grow(a, 8).ok());
  ASSERT_TRUE(bm.grow(b, 8).ok());
  bm.commit(a, tokens, 8);
  bm.commit(b, tokens, 8);  // same hashes: b's copies stay private
  bm.release(b);
  EXPECT_EQ(bm.evictable_blocks(), 0);
  bm.release(a);
  EXPECT_EQ(bm.evictable_blocks(), 2);
  EXPECT_EQ(bm.free_blocks(), 8);
  BlockTable c;
  EXPECT_EQ(bm.match_prefix(iota_tokens(9), c), 8);
  bm.release(c);
}

TEST(BlockManager, PrefixCachingOffNeverMatches) {
  BlockManager bm(8, 4, false);
  const auto tokens = iota_tokens(9);
  BlockTable a;
  ASSERT_TRUE(bm.grow(a, 9).ok());
  bm.commit(a, tokens, 9);
  bm.release(a);
  BlockTable b;
  EXPECT_EQ(bm.match_prefix(tokens, b), 0);
  EXPECT_EQ(bm.evictable_blocks(), 0);
}

TEST(BlockManager, CountsQueriesAndHitsInTokens) {
  BlockManager bm(8, 4, true);
  bm.record_query(10, 8);
  bm.record_query(5, 0);
  EXPECT_EQ(bm.prefix_stats().queries, 15);
  EXPECT_EQ(bm.prefix_stats().hits, 8);
}

}  // namespace
}  // namespace kiln

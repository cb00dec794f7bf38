// The CPU pooled DSA indexer: pool keys, scores, and which positions a query keeps (candidates, top pools, tail).
#include "kernels/cpu/pooled_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::cpu {
namespace {

TEST(PooledIndexerTest, PoolKeyIsAGatedAverage) {
  // Equal gates: the mean. A dominant gate in channel 1: that token's key.
  std::vector<float> k = {1, 5, 3, 7}, gate = {0, 0, 0, 50}, ape(4, 0.f), key(2);
  pooled_indexer_pool_key(k.data(), gate.data(), ape.data(), 2, 2, key.data());
  EXPECT_NEAR(key[0], 2.0f, 1e-6);
  EXPECT_NEAR(key[1], 7.0f, 1e-5);
  // ape shifts the gate per position.
  std::vector<float> ape2 = {0, 0, std::log(3.0f), -50};
  pooled_indexer_pool_key(k.data(), gate.data(), ape2.data(), 2, 2, key.data());
  EXPECT_NEAR(key[0], 0.25f * 1 + 0.75f * 3, 1e-6);
  EXPECT_NEAR(key[1], 6.0f, 1e-5);
}

TEST(PooledIndexerTest, ScoresAreWeightedReluDots) {
  // Two heads of dim 2, two pools.
  std::vector<float> q = {1, 0, 0, 1}, w = {2, -1}, keys = {3, -1, -1, 4}, scores(2);
  pooled_indexer_scores(q.data(), w.data(), keys.data(), 1, 2, 2, 2, 0.5f, scores.data());
  EXPECT_FLOAT_EQ(scores[0], 2 * 1.5f - 1 * 0.0f);
  EXPECT_FLOAT_EQ(scores[1], 2 * 0.0f - 1 * 2.0f);
}

std::vector<int32_t> select(const std::vector<float>& scores, int64_t q_pos, int64_t pool, int64_t topk, bool tail) {
  const int64_t width = topk + (tail ? pool - 1 : 0);
  std::vector<int32_t> out(width);
  pooled_indexer_select(scores.data(), static_cast<int64_t>(scores.size()), q_pos, pool, topk, tail, out.data(),
                        width);
  out.erase(std::remove(out.begin(), out.end(), -1), out.end());
  return out;
}

TEST(PooledIndexerTest, SelectsTopCandidatePoolsThenTheTail) {
  // Pools of 4; scores of pools 0..4. index_topk 8 keeps two pools.
  const std::vector<float> scores = {0.1f, 0.9f, 0.5f, 0.7f, 5.0f};
  // q_pos 5: only pool 0 is complete and visible; tail = positions 4, 5.
  EXPECT_EQ(select(scores, 5, 4, 8, true), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(select(scores, 5, 4, 8, false), (std::vector<int32_t>{0, 1, 2, 3}));
  // q_pos 15: pools 0..3 are candidates (pool 3 ends at 15: no tail); top two are 1 then 3. Pool 4 is not visible.
  EXPECT_EQ(select(scores, 15, 4, 8, true), (std::vector<int32_t>{4, 5, 6, 7, 12, 13, 14, 15}));
  // q_pos 18: pool 4 ends at 19, still invisible; tail 16..18.
  EXPECT_EQ(select(scores, 18, 4, 8, true), (std::vector<int32_t>{4, 5, 6, 7, 12, 13, 14, 15, 16, 17, 18}));
  // q_pos 2: no complete pool; the tail alone.
  EXPECT_EQ(select(scores, 2, 4, 8, true), (std::vector<int32_t>{0, 1, 2}));
}

TEST(PooledIndexerTest, TiesGoAsTorchTopkOnTheCpu) {
  // torch.topk([0, 1, 0, 0], 2) on the CPU returns [1, 3]: pool 3 of the three tied, not pool 0.
  const std::vector<float> scores = {0.0f, 1.0f, 0.0f, 0.0f};
  EXPECT_EQ(select(scores, 15, 2, 4, false), (std::vector<int32_t>{2, 3, 6, 7}));
}

}  // namespace
}  // namespace kiln::cpu

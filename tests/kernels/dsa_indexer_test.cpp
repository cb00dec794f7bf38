#include "kernels/cpu/dsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/topk.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

struct Case {
  int64_t t_q, t_kv, heads, dim, topk;
};

class IndexerTest : public ::testing::TestWithParam<Case> {};

TEST_P(IndexerTest, ScoresAndTopkMatchReference) {
  const Case c = GetParam();
  auto q = test::random_floats(c.t_q * c.heads * c.dim, 51);
  auto k = test::random_floats(c.t_kv * c.dim, 52);
  auto w = test::random_floats(c.t_q * c.heads, 53);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  std::vector<float> scores(c.t_q * c.t_kv);
  dsa_indexer_scores(q.data(), k.data(), w.data(), c.t_q, c.t_kv, c.heads, c.dim, scale, scores.data());
  std::vector<int32_t> top(c.t_q * c.topk);
  dsa_select_topk(scores.data(), c.t_q, c.t_kv, c.topk, top.data());
  for (int64_t s = 0; s < c.t_q; ++s) {
    const int64_t visible = c.t_kv - c.t_q + s + 1;
    for (int64_t t = 0; t < c.t_kv; ++t) {
      if (t >= visible) {
        ASSERT_TRUE(std::isinf(scores[s * c.t_kv + t]) && scores[s * c.t_kv + t] < 0);
        continue;
      }
      double ref = 0;
      for (int64_t h = 0; h < c.heads; ++h) {
        double d = 0;
        for (int64_t i = 0; i < c.dim; ++i) d += static_cast<double>(q[(s * c.heads + h) * c.dim + i]) * k[t * c.dim + i];
        ref += w[s * c.heads + h] * std::max(d * scale, 0.0);
      }
      ASSERT_NEAR(scores[s * c.t_kv + t], ref, 1e-5);
    }
    // Reference top-k: stable sort of the visible positions by score descending.
    std::vector<int32_t> order(visible);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return scores[s * c.t_kv + a] > scores[s * c.t_kv + b]; });
    const int64_t k_eff = std::min(c.topk, visible);
    for (int64_t j = 0; j < c.topk; ++j) ASSERT_EQ(top[s * c.topk + j], j < k_eff ? order[j] : -1) << s << "," << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerTest,
                         ::testing::Values(Case{1, 1, 1, 1, 1}, Case{5, 5, 2, 8, 3}, Case{3, 40, 4, 32, 16},
                                           Case{7, 7, 3, 16, 64}, Case{33, 100, 2, 64, 20}));

TEST(Topk, TiesGoToTheLowerIndex) {
  const float v[] = {1, 3, 3, 2, 3, 0, 3};
  int32_t out[3];
  topk_indices(v, 7, 3, out);  // torch.topk (CPU) returns [1, 6, 4] here
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 2);
  EXPECT_EQ(out[2], 4);
  std::vector<float> zeros(5000, 0.0f);
  zeros[4321] = NAN;
  std::vector<int32_t> z(10);
  topk_indices(zeros.data(), 5000, 10, z.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(z[i], i);
  int32_t all[3];
  const float with_nan[] = {NAN, -1.0f, -INFINITY};
  topk_indices(with_nan, 3, 3, all);
  EXPECT_EQ(all[0], 1);
  EXPECT_EQ(all[1], 2);
  EXPECT_EQ(all[2], 0);
}

TEST(DsaIndexer, AllReluZeroScoresSelectEarliestPositions) {
  // Every logit negative: all visible scores are 0 and the tie rule picks positions 0, 1, 2, ...
  const int64_t t_q = 2, t_kv = 9, heads = 2, dim = 4, topk = 4;
  std::vector<float> q(t_q * heads * dim, 1.0f), k(t_kv * dim, -1.0f), w(t_q * heads, 1.0f), scores(t_q * t_kv);
  dsa_indexer_scores(q.data(), k.data(), w.data(), t_q, t_kv, heads, dim, 0.5f, scores.data());
  std::vector<int32_t> top(t_q * topk);
  // Both rows see more keys (8 and 9) than they keep, all scoring 0: both cuts fall inside the tie.
  EXPECT_EQ(dsa_select_topk(scores.data(), t_q, t_kv, topk, top.data()), 2);
  for (int64_t s = 0; s < t_q; ++s)
    for (int64_t j = 0; j < topk; ++j) EXPECT_EQ(top[s * topk + j], j);
}

TEST(DsaIndexer, CountsOnlyTiesAtTheCut) {
  // One query over 6 keys, top-3. Ties above the cut, below it, or a row that keeps every key are unambiguous.
  int32_t top[3];
  const float above[] = {5, 5, 4, 1, 1, 0};   // kept {0, 1, 2}: the tie at 5 is kept whole, the tie at 1 left whole
  EXPECT_EQ(dsa_select_topk(above, 1, 6, 3, top), 0);
  const float at_cut[] = {5, 2, 4, 2, 1, 2};  // kept {0, 2} and one of three 2s
  EXPECT_EQ(dsa_select_topk(at_cut, 1, 6, 3, top), 1);
  EXPECT_EQ(top[2], 1);
  const float exact[] = {5, 2, 4, 2, 1, 0};   // kept {0, 2} and one of two 2s
  EXPECT_EQ(dsa_select_topk(exact, 1, 6, 3, top), 1);
  const float kept_whole[] = {5, 2, 4, 2, 1, 0};
  int32_t four[4];
  EXPECT_EQ(dsa_select_topk(kept_whole, 1, 6, 4, four), 0);  // both 2s kept
  const float short_row[] = {0, 0};
  EXPECT_EQ(dsa_select_topk(short_row, 1, 2, 3, top), 0);  // fewer keys than top-k: all kept
}

}  // namespace
}  // namespace kiln::cpu

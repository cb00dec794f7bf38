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
    // A valid top-k of the visible keys: min(topk, visible) distinct visible positions, each scoring at least as
    // much as every visible key left out (which of several tied keys is kept is torch's choice: tests below).
    const int64_t k_eff = std::min(c.topk, visible);
    std::vector<char> kept(c.t_kv, 0);
    float lowest_kept = INFINITY;
    for (int64_t j = 0; j < c.topk; ++j) {
      const int32_t t = top[s * c.topk + j];
      if (j >= k_eff) {
        ASSERT_EQ(t, -1) << s << "," << j;
        continue;
      }
      ASSERT_TRUE(t >= 0 && t < visible && !kept[t]) << s << "," << j;
      kept[t] = 1;
      lowest_kept = std::min(lowest_kept, scores[s * c.t_kv + t]);
    }
    for (int64_t t = 0; t < visible; ++t)
      if (!kept[t]) ASSERT_LE(scores[s * c.t_kv + t], lowest_kept) << s << "," << t;
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

TEST(Topk, TorchCpuOrderAmongTies) {
  // What torch 2.x's torch.topk returns on the CPU for these rows (nth_element path, then partial_sort path).
  const float v[] = {1, 3, 3, 2, 3, 0, 3};
  int32_t out[3];
  torch_cpu_topk_indices(v, 7, 3, out);
  EXPECT_EQ(std::vector<int32_t>(out, out + 3), (std::vector<int32_t>{1, 6, 4}));
  std::vector<float> zeros(12, 0.0f);
  int32_t five[5];
  torch_cpu_topk_indices(zeros.data(), 12, 5, five);
  EXPECT_EQ(std::vector<int32_t>(five, five + 5), (std::vector<int32_t>{9, 7, 8, 6, 10}));
  std::vector<float> long_row(300, 0.0f);
  long_row[17] = 1, long_row[250] = 2;
  int32_t four[4];
  torch_cpu_topk_indices(long_row.data(), 300, 4, four);
  EXPECT_EQ(std::vector<int32_t>(four, four + 4), (std::vector<int32_t>{250, 17, 1, 3}));
}

TEST(DsaIndexer, AllReluZeroScoresSelectAsTorchDoes) {
  // Every logit negative: all visible scores are 0, and the query keeps the tied keys torch.topk keeps on the CPU
  // from its row (masked keys at −inf): for a 10-key row whose last key is masked, torch returns [7, 5, 6, 1].
  const int64_t t_q = 1, t_kv = 10, heads = 2, dim = 4, topk = 4;
  std::vector<float> q(t_q * heads * dim, 1.0f), k(t_kv * dim, -1.0f), w(t_q * heads, 1.0f), scores(t_kv);
  dsa_indexer_scores(q.data(), k.data(), w.data(), t_q, t_kv, heads, dim, 0.5f, scores.data());
  // The query at position 9 of 10 sees them all; make it the second of two so key 9 is masked.
  std::vector<float> two_rows(2 * t_kv);
  std::copy(scores.begin(), scores.end(), two_rows.begin());
  std::copy(scores.begin(), scores.end(), two_rows.begin() + t_kv);
  two_rows[9] = -INFINITY;
  std::vector<int32_t> top(2 * topk);
  EXPECT_EQ(dsa_select_topk(two_rows.data(), 2, t_kv, topk, top.data()), 2);
  EXPECT_EQ(std::vector<int32_t>(top.begin(), top.begin() + topk), (std::vector<int32_t>{7, 5, 6, 1}));
}

// With row_lengths each query ranks over the row transformers would have (its one-shot prompt's keys, the ones after
// the query masked), not the step's: through exact ties torch's procedure keeps other keys for another row length.
TEST(DsaIndexer, RowLengthsRankOverTransformersRow) {
  const int64_t t_kv = 10, topk = 4;
  const std::vector<float> zeros(t_kv, 0.0f);  // one query at position 9, every key tied
  std::vector<int32_t> own(topk), prompt_row(topk);
  dsa_select_topk(zeros.data(), 1, t_kv, topk, own.data());
  const int64_t length = 300;  // a 300-token prompt's first chunk
  dsa_select_topk(zeros.data(), 1, t_kv, topk, prompt_row.data(), &length);
  std::vector<float> padded(length, -INFINITY);
  std::copy(zeros.begin(), zeros.end(), padded.begin());
  std::vector<int32_t> want(topk);
  torch_cpu_topk_indices(padded.data(), length, topk, want.data());
  EXPECT_EQ(prompt_row, want);
  EXPECT_NE(prompt_row, own) << "the row's length no longer decides the tied keys: pick another case";
  // A row shorter than the step's keys (the first token of a verification pass): the keys past it are masked ones.
  std::vector<float> two(2 * t_kv, 0.0f);
  two[9] = -INFINITY;  // the first query (position 8) cannot see key 9
  const int64_t rows[] = {9, 10};
  std::vector<int32_t> both(2 * topk), first(topk);
  dsa_select_topk(two.data(), 2, t_kv, topk, both.data(), rows);
  dsa_select_topk(zeros.data(), 1, 9, topk, first.data());  // that query's own decode step: 9 keys
  EXPECT_EQ(std::vector<int32_t>(both.begin(), both.begin() + topk), first);
}

TEST(DsaIndexer, CountsOnlyTiesAtTheCut) {
  // One query over 6 keys, top-3. Ties above the cut, below it, or a row that keeps every key are unambiguous.
  int32_t top[3];
  const float above[] = {5, 5, 4, 1, 1, 0};   // kept {0, 1, 2}: the tie at 5 is kept whole, the tie at 1 left whole
  EXPECT_EQ(dsa_select_topk(above, 1, 6, 3, top), 0);
  const float at_cut[] = {5, 2, 4, 2, 1, 2};  // kept {0, 2} and one of three 2s
  EXPECT_EQ(dsa_select_topk(at_cut, 1, 6, 3, top), 1);
  EXPECT_EQ(at_cut[top[2]], 2.0f);
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

// The CPU mHC kernels: the maps' ranges and the Sinkhorn projection, a case worked by hand, collapse and mix.
#include "kernels/cpu/mhc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "random_data.h"

namespace kiln::cpu {
namespace {

using test::random_floats;

TEST(MhcTest, ZeroProjectionGivesUniformMaps) {
  const int64_t s = 4, d = 8;
  std::vector<float> fn((2 + s) * s * s * d, 0.f), base((2 + s) * s, 0.f), scale = {1, 1, 1};
  MhcParams p{fn.data(), base.data(), scale.data(), s, d};
  std::vector<float> x = random_floats(s * d, 1), pre(s), post(s), comb(s * s);
  mhc_maps(x.data(), 1, p, pre.data(), post.data(), comb.data());
  for (int64_t i = 0; i < s; ++i) {
    EXPECT_NEAR(pre[i], 0.5f + 1e-6f, 1e-7);
    EXPECT_NEAR(post[i], 1.0f, 1e-7);
    for (int64_t j = 0; j < s; ++j) EXPECT_NEAR(comb[i * s + j], 0.25f, 1e-5);
  }
}

TEST(MhcTest, CombIsNearlyDoublyStochastic) {
  for (int64_t s : {2, 4}) {
    const int64_t d = 16, n = 5;
    std::vector<float> fn = random_floats((2 + s) * s * s * d, 2, -0.5f, 0.5f), base = random_floats((2 + s) * s, 3),
                       scale = {0.7f, 1.3f, 2.0f};
    MhcParams p{fn.data(), base.data(), scale.data(), s, d};
    std::vector<float> x = random_floats(n * s * d, 4, -3, 3), pre(n * s), post(n * s), comb(n * s * s);
    mhc_maps(x.data(), n, p, pre.data(), post.data(), comb.data());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < s; ++i) {
        EXPECT_GT(pre[t * s + i], 0.f);
        EXPECT_LT(pre[t * s + i], 1.0f + 2e-6f);
        EXPECT_GT(post[t * s + i], 0.f);
        EXPECT_LT(post[t * s + i], 2.f);
        float row = 0.f, col = 0.f;
        for (int64_t j = 0; j < s; ++j) row += comb[t * s * s + i * s + j], col += comb[t * s * s + j * s + i];
        EXPECT_NEAR(col, 1.0f, 1e-4);  // the last step normalises columns
        EXPECT_NEAR(row, 1.0f, 5e-2);  // rows only approach 1: 20 iterations do not converge fully
      }
  }
}

TEST(MhcTest, CollapseAndMix) {
  // Two streams of width 2.
  std::vector<float> x = {1, 2, 10, 20}, pre = {0.5f, 2.0f}, h(2);
  mhc_collapse(x.data(), pre.data(), 1, 2, 2, h.data());
  EXPECT_EQ(h, (std::vector<float>{20.5f, 41.0f}));
  // x_j ← post_j·y + Σ_i comb[i][j] x_i with comb = [[0.25, 0.75], [0.75, 0.25]].
  std::vector<float> y = {100, 200}, post = {1.0f, 0.5f}, comb = {0.25f, 0.75f, 0.75f, 0.25f};
  mhc_mix(x.data(), y.data(), post.data(), comb.data(), 1, 2, 2);
  EXPECT_EQ(x, (std::vector<float>{100 + 0.25f + 7.5f, 200 + 0.5f + 15, 50 + 0.75f + 2.5f, 100 + 1.5f + 5}));
}

}  // namespace
}  // namespace kiln::cpu

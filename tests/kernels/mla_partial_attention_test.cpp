// Attention split by keys and merged by log-sum-exp (kernels/cpu/mla_partial_attention.h) against the unsplit
// absorbed kernel: random shapes and head counts, keys dealt to the parts by position (p mod D, as decode-context
// ranks own them) or at random, parts left empty. One part is the unsplit kernel bit for bit; several agree with it
// to kTolerance of the output's scale (measured ≤ 7.2e-7: fp32 summation order only).
#include "kernels/cpu/mla_partial_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/mla_attention.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

constexpr double kTolerance = 2e-6;

struct Shape {
  int64_t heads, latent, rope, keys, parts;
  bool random_owner;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.heads << " heads, " << s.latent << "+" << s.rope << ", " << s.keys << " keys in " << s.parts
      << (s.random_owner ? " random parts" : " parts by position");
}

class PartialAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(PartialAttention, MergedPartsEqualTheUnsplitKernel) {
  const Shape s = GetParam();
  const int64_t row = s.latent + s.rope;
  const auto q = test::random_floats(s.heads * row, 7 + s.heads, -1.5f, 1.5f);
  const auto cache = test::random_floats(s.keys * row, 11 + s.keys, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(row));
  std::vector<int64_t> all(s.keys);
  for (int64_t t = 0; t < s.keys; ++t) all[t] = t;

  std::vector<float> want(s.heads * s.latent), scratch(s.heads * s.keys + row);
  mla_attention_absorbed_f32(q.data(), s.heads, s.latent, s.rope, cache.data(), all.data(), s.keys, scale, want.data(),
                             scratch.data());

  // Deal the keys to the parts; each part attends over its own (in position order).
  std::mt19937 rng(static_cast<uint32_t>(s.keys * 31 + s.parts));
  std::vector<std::vector<int64_t>> owned(s.parts);
  for (int64_t t = 0; t < s.keys; ++t)
    owned[s.random_owner ? rng() % s.parts : t % s.parts].push_back(t);
  std::vector<float> outs(s.parts * s.heads * s.latent), lses(s.parts * s.heads);
  for (int64_t p = 0; p < s.parts; ++p)
    mla_attention_absorbed_partial(q.data(), s.heads, s.latent, s.rope, cache.data(), owned[p].data(),
                                   static_cast<int64_t>(owned[p].size()), scale, outs.data() + p * s.heads * s.latent,
                                   lses.data() + p * s.heads, scratch.data());
  std::vector<float> got(s.heads * s.latent), lse(s.heads);
  merge_attention_partials(outs.data(), lses.data(), s.parts, s.heads, s.latent, got.data(), lse.data());

  if (s.parts == 1) {
    EXPECT_EQ(got, want) << "one part is the unsplit kernel";
  } else {
    double scale_out = 1e-30, worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale_out = std::max(scale_out, std::abs(static_cast<double>(want[i])));
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LE(worst / scale_out, kTolerance) << "largest difference " << worst << " rel " << worst / scale_out;
  }
  // The merged LSE is the log-sum-exp of every key's score (fp64 reference).
  for (int64_t h = 0; h < s.heads; ++h) {
    double m = -1e300, z = 0.0;
    std::vector<double> sc(s.keys);
    for (int64_t t = 0; t < s.keys; ++t) {
      double d = 0.0;
      for (int64_t c = 0; c < row; ++c) d += static_cast<double>(q[h * row + c]) * cache[t * row + c];
      sc[t] = d * scale;
      m = std::max(m, sc[t]);
    }
    for (double x : sc) z += std::exp(x - m);
    EXPECT_NEAR(lse[h], m + std::log(z), 1e-5 * std::max(1.0, std::abs(m))) << "head " << h;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PartialAttention,
                         ::testing::Values(Shape{1, 32, 8, 1, 1, false}, Shape{4, 32, 8, 40, 1, false},
                                           Shape{4, 32, 8, 40, 2, false}, Shape{3, 16, 0, 7, 4, false},
                                           Shape{8, 64, 16, 129, 3, false}, Shape{2, 32, 8, 3, 4, false},
                                           Shape{16, 128, 32, 500, 8, true}, Shape{5, 24, 8, 33, 2, true},
                                           Shape{1, 512, 64, 257, 4, false}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "h" + std::to_string(s.heads) + "_l" + std::to_string(s.latent) + "_r" +
                                  std::to_string(s.rope) + "_k" + std::to_string(s.keys) + "_p" +
                                  std::to_string(s.parts) + (s.random_owner ? "_random" : "_by_position");
                         });

TEST(PartialAttention, EmptyPartsWeighNothingAndAllEmptyMergesToZero) {
  const int64_t H = 2, L = 4;
  // Part 0 empty (−inf, zeros), part 1 a real result: the merge is part 1's.
  std::vector<float> outs = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> lses = {-inf, -inf, 0.5f, -1.0f};
  std::vector<float> got(H * L), lse(H);
  merge_attention_partials(outs.data(), lses.data(), 2, H, L, got.data(), lse.data());
  EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(lse, (std::vector<float>{0.5f, -1.0f}));
  // NaN and +inf count as nothing; nothing anywhere is zeros and −inf.
  std::vector<float> bad = {std::nanf(""), inf, -inf, -inf};
  merge_attention_partials(outs.data(), bad.data(), 2, H, L, got.data(), lse.data());
  EXPECT_EQ(got, std::vector<float>(H * L, 0.0f));
  EXPECT_EQ(lse[0], -inf);
  // A partial kernel call without keys: zeros and −inf.
  std::vector<float> q(H * 6, 1.0f), out(H * L, 9.0f), part_lse(H, 9.0f), scratch(6);
  mla_attention_absorbed_partial(q.data(), H, L, 2, nullptr, nullptr, 0, 1.0f, out.data(), part_lse.data(),
                                 scratch.data());
  EXPECT_EQ(out, std::vector<float>(H * L, 0.0f));
  EXPECT_EQ(part_lse, std::vector<float>(H, -inf));
}

}  // namespace
}  // namespace kiln::cpu

// The host twin of the CUDA format's dummy modules (exl3_synthetic.h): the initializer's std, the same words for
// the same seed and name, different ones across names and seeds.
#include <gtest/gtest.h>

#include <cmath>

#include "exl3_synthetic.h"

namespace kiln::exl3 {
namespace {

TEST(Exl3Synthetic, ModulesHaveTheInitializerStdAndFollowTheSeed) {
  for (int bits : {2, 4, 6}) {
    const SyntheticModule a = make_synthetic_module("m.q_proj", 1000, 700, bits, 5);
    EXPECT_EQ(a.module.k_pad, 1024);
    EXPECT_EQ(a.module.n_pad, 768);
    EXPECT_EQ(a.trellis->size(), static_cast<size_t>(1024 / 16 * 768 / 16 * 16 * bits));
    const std::vector<float> w = dequantize(a.module);
    double sq = 0;
    for (float v : w) sq += double(v) * v;
    const double std = std::sqrt(sq / w.size());
    EXPECT_GT(std, 0.015) << "K " << bits;
    EXPECT_LT(std, 0.025) << "K " << bits;
    EXPECT_EQ(*make_synthetic_module("m.q_proj", 1000, 700, bits, 5).trellis, *a.trellis);
    EXPECT_NE(*make_synthetic_module("m.k_proj", 1000, 700, bits, 5).trellis, *a.trellis);
    EXPECT_NE(*make_synthetic_module("m.q_proj", 1000, 700, bits, 6).trellis, *a.trellis);
  }
}

}  // namespace
}  // namespace kiln::exl3

#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kernels/cpu/half_float.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

// fp64 reference over the exactly widened weights; the tolerance scales with Σ|x·w| (fp32 accumulation).
void expect_matches_reference(const std::vector<float>& x, const std::vector<float>& w_wide, int64_t n, int64_t in,
                              int64_t out, const std::vector<float>& y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        ref += static_cast<double>(x[t * in + k]) * w_wide[o * in + k];
        magnitude += std::abs(static_cast<double>(x[t * in + k]) * w_wide[o * in + k]);
      }
      ASSERT_NEAR(y[t * out + o], ref, 1e-5 * magnitude + 1e-30) << "t=" << t << " o=" << o;
    }
  }
}

class GemmTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(GemmTest, AllWeightDtypesMatchFp64Reference) {
  const auto [n, in, out] = GetParam();
  const auto x = test::random_floats(n * in, 100 + n, -2.f, 2.f);
  const auto w = test::random_floats(out * in, 200 + in, -1.f, 1.f);
  std::vector<float> y(n * out, -7.f);

  gemm_f32(x.data(), n, in, w.data(), out, y.data());
  expect_matches_reference(x, w, n, in, out, y);

  std::vector<uint16_t> w16(w.size());
  std::vector<float> wide(w.size());
  float_to_bf16(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  bf16_to_float(w16.data(), wide.data(), static_cast<int64_t>(w.size()));
  std::fill(y.begin(), y.end(), -7.f);
  ASSERT_TRUE(gemm(x.data(), n, in, w16.data(), DType::kBF16, out, y.data()).ok());
  expect_matches_reference(x, wide, n, in, out, y);

  float_to_fp16(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  fp16_to_float(w16.data(), wide.data(), static_cast<int64_t>(w.size()));
  std::fill(y.begin(), y.end(), -7.f);
  ASSERT_TRUE(gemm(x.data(), n, in, w16.data(), DType::kF16, out, y.data()).ok());
  expect_matches_reference(x, wide, n, in, out, y);
}

// Odd sizes exercise the 4-token tiles' remainders, token blocks of 64 and the threaded path.
INSTANTIATE_TEST_SUITE_P(Sizes, GemmTest,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(3, 17, 5),
                                           std::make_tuple(4, 64, 33), std::make_tuple(7, 129, 70),
                                           std::make_tuple(65, 130, 71), std::make_tuple(133, 257, 19),
                                           std::make_tuple(1, 2048, 515)));

TEST(Gemm, RejectsUnsupportedWeightDtype) {
  float x = 1, y = 0;
  int8_t w = 1;
  const Status s = gemm(&x, 1, 1, &w, DType::kI8, 1, &y);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("I8"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cpu

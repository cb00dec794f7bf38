// The probe's host reference: bf16 rounding as the GPU rounds, and sums in rank order from rank 0's value.
#include "probe_pattern.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace kiln::nccl {
namespace {

TEST(ProbePattern, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits(1.0f + 1.0f / 256.0f), 0x3F80);  // halfway, even stays
  EXPECT_EQ(bf16_bits(1.0f + 3.0f / 256.0f), 0x3F82);  // halfway, odd rounds up
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(bf16_value(0x3F80), 1.0f);
}

TEST(ProbePattern, ExpectedSumIsTheRankOrderSum) {
  const int64_t n = 4096;
  for (int world : {1, 2, 3, 5}) {
    std::vector<std::vector<char>> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(probe_input(DType::kF32, r, n));
    const auto expected = probe_expected_sum(DType::kF32, world, n);
    for (int64_t i = 0; i < n; ++i) {
      float acc, v;
      std::memcpy(&acc, inputs[0].data() + 4 * i, 4);
      for (int r = 1; r < world; ++r) {
        std::memcpy(&v, inputs[r].data() + 4 * i, 4);
        acc += v;
      }
      float e;
      std::memcpy(&e, expected.data() + 4 * i, 4);
      ASSERT_EQ(std::memcmp(&acc, &e, 4), 0) << "world " << world << " element " << i;
    }
  }
}

// The data must be able to tell a wrong order or a sum started from +0.0 apart from the right one.
TEST(ProbePattern, DataDistinguishesOrderAndSignedZero) {
  const int64_t n = 4096;
  std::vector<std::vector<char>> in;
  for (int r = 0; r < 3; ++r) in.push_back(probe_input(DType::kF32, r, n));
  bool order_matters = false, has_negative_zero = false;
  for (int64_t i = 0; i < n; ++i) {
    float a, b, c;
    std::memcpy(&a, in[0].data() + 4 * i, 4);
    std::memcpy(&b, in[1].data() + 4 * i, 4);
    std::memcpy(&c, in[2].data() + 4 * i, 4);
    const float forward = (a + b) + c, backward = (c + b) + a;
    if (std::memcmp(&forward, &backward, 4) != 0) order_matters = true;
    if (a == 0.0f && std::signbit(a)) has_negative_zero = true;  // one rank: a sum from +0.0 would give +0.0
  }
  EXPECT_TRUE(order_matters);
  EXPECT_TRUE(has_negative_zero);
  const auto bf = probe_input(DType::kBF16, 1, n);
  EXPECT_EQ(bf.size(), static_cast<size_t>(2 * n));
}

}  // namespace
}  // namespace kiln::nccl

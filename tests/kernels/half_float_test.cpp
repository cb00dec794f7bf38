#include "kernels/cpu/half_float.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

TEST(HalfFloat, Bf16WidensExactlyAndRoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    if (!std::isnan(f)) EXPECT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
}

TEST(HalfFloat, Bf16RoundsToNearestEven) {
  auto round = [](uint32_t bits) { return float_to_bf16(std::bit_cast<float>(bits)); };
  EXPECT_EQ(round(0x3f808000u), 0x3f80);  // tie, even below
  EXPECT_EQ(round(0x3f818000u), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(round(0x3f808001u), 0x3f81);  // above the tie
  EXPECT_EQ(round(0x3f807fffu), 0x3f80);  // below the tie
  EXPECT_EQ(round(0x7f7fffffu), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(round(0xff800000u), 0xff80);  // -inf stays
  EXPECT_EQ(round(0x7f800001u), 0x7fc0);  // signalling NaN -> quiet NaN, not inf
  // Against an fp64 reference on random values: the chosen neighbour is the nearest one.
  auto values = test::random_floats(20000, 7, -1e6f, 1e6f);
  for (float v : values) {
    const float r = bf16_to_float(float_to_bf16(v));
    const uint32_t b = std::bit_cast<uint32_t>(v) & 0xffff0000u;
    const float down = std::bit_cast<float>(b), up = std::bit_cast<float>(b + 0x10000u);
    const double err = std::abs(static_cast<double>(r) - v);
    EXPECT_LE(err, std::min(std::abs(static_cast<double>(down) - v), std::abs(static_cast<double>(up) - v)));
  }
}

TEST(HalfFloat, Fp16WidensAndRoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ((h & 0x7c00u), 0x7c00u);
      continue;
    }
    EXPECT_EQ(float_to_fp16(f), h) << std::hex << h;
  }
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
}

TEST(HalfFloat, Fp16RoundsToNearestEven) {
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);   // tie above the max rounds to even = inf
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);   // tie between 0 and the smallest subnormal: even = 0
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002); // tie between 1 and 2 subnormal units: even = 2
  EXPECT_EQ(float_to_fp16(0x1.ffcp-15f), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);        // tie, even below
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);    // tie, odd below: up
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
#ifdef __FLT16_MAX__
  // The compiler's own float -> _Float16 conversion is IEEE round-to-nearest-even.
  for (float scale : {1e-6f, 1e-3f, 1.0f, 1e3f, 7e4f}) {
    for (float v : test::random_floats(5000, 11, -scale, scale)) {
      const _Float16 ref = static_cast<_Float16>(v);
      EXPECT_EQ(float_to_fp16(v), std::bit_cast<uint16_t>(ref)) << v;
    }
  }
#endif
}

TEST(HalfFloat, ArrayConversionsMatchScalar) {
  auto v = test::random_floats(1001, 3, -100.f, 100.f);
  std::vector<uint16_t> b(v.size()), h(v.size());
  std::vector<float> back(v.size());
  float_to_bf16(v.data(), b.data(), static_cast<int64_t>(v.size()));
  float_to_fp16(v.data(), h.data(), static_cast<int64_t>(v.size()));
  bf16_to_float(b.data(), back.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(b[i], float_to_bf16(v[i]));
    EXPECT_EQ(back[i], bf16_to_float(b[i]));
  }
  fp16_to_float(h.data(), back.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(h[i], float_to_fp16(v[i]));
    EXPECT_EQ(back[i], fp16_to_float(h[i]));
  }
}

// The MoE router's fp32 weights as bf16 terms (the CUDA prefill gate's tensor-core GEMM): their sum is the value, bit
// for bit, and the count says how many planes are needed.
TEST(HalfFloat, Bf16TermsSumExactlyToTheValue) {
  auto sum = [](const std::vector<uint16_t>& t, size_t n, size_t i) {
    return static_cast<double>(bf16_to_float(t[i])) + bf16_to_float(t[n + i]) + bf16_to_float(t[2 * n + i]);
  };
  for (auto [lo, hi] : {std::pair{-1.f, 1.f}, std::pair{-1e-30f, 1e-30f}, std::pair{-3e35f, 3e35f}}) {
    auto x = test::random_floats(4096, 11, lo, hi);
    x[5] = 0.f, x[6] = -0.f, x[7] = std::numeric_limits<float>::min();  // zeros and the smallest normal
    std::vector<uint16_t> t(3 * x.size(), 0xffff);
    ASSERT_EQ(bf16_terms(x.data(), static_cast<int64_t>(x.size()), t.data()), 3);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(sum(t, x.size(), i), static_cast<double>(x[i])) << x[i];
  }
  // bf16 values: one plane (the others zero); 16 significant bits: two.
  std::vector<float> b(256);
  for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_to_float(static_cast<uint16_t>(0x3c00 + 37 * i));
  std::vector<uint16_t> t(3 * b.size());
  ASSERT_EQ(bf16_terms(b.data(), static_cast<int64_t>(b.size()), t.data()), 1);
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(bf16_to_float(t[i]), b[i]);
    EXPECT_EQ(t[b.size() + i] & 0x7fff, 0);
    EXPECT_EQ(t[2 * b.size() + i] & 0x7fff, 0);
  }
  b[3] = std::bit_cast<float>(0x3f80ff00u);  // 1 + 255·2⁻¹⁶: 16 significant bits
  ASSERT_EQ(bf16_terms(b.data(), static_cast<int64_t>(b.size()), t.data()), 2);
  EXPECT_EQ(sum(t, b.size(), 3), static_cast<double>(b[3]));
  // No sum of nearest-bf16 terms: not finite, an fp32 subnormal below bf16's grid, a value whose nearest bf16 is inf.
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    std::bit_cast<float>(0x00000001u), std::numeric_limits<float>::max()}) {
    b[9] = bad;
    EXPECT_EQ(bf16_terms(b.data(), static_cast<int64_t>(b.size()), t.data()), 0) << bad;
  }
}

}  // namespace
}  // namespace kiln::cpu

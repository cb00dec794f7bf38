// The fp8_ds_mla row format byte for byte: e4m3 conversions (every code, ties, saturation), the row layout with a
// hand-computed vector, DeepSeek / GLM-5.3-Flash row sizes, and the quantization error bound.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp8_e4m3.h"
#include "fp8_mla_row.h"

namespace kiln::fp8mla {
namespace {

TEST(Fp8E4m3, KnownCodes) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(float_to_e4m3(0.5f), 0x30);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);   // the smallest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(7.0f, -9)), 0x07);   // the largest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);   // the smallest normal
  EXPECT_EQ(float_to_e4m3(1.75f), 0x3E);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x3E), 1.75f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(float_to_e4m3(std::nanf("")) & 0x7F, 0x7F);
}

TEST(Fp8E4m3, EveryFiniteCodeRoundTrips) {
  int finite = 0;
  for (int v = 0; v < 256; ++v) {
    const auto code = static_cast<uint8_t>(v);
    const float x = e4m3_to_float(code);
    if (std::isnan(x)) continue;
    ++finite;
    EXPECT_EQ(float_to_e4m3(x), code) << "code " << v << " = " << x;
  }
  EXPECT_EQ(finite, 254);
}

TEST(Fp8E4m3, TiesRoundToEvenAndLargeValuesSaturate) {
  // Halfway between 1.0 (0x38, even) and 1.125 (0x39): to 1.0; between 1.125 and 1.25 (0x3A): to 1.25.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);
  // Subnormal ties: 0.5 · 2^-9 → 0; 1.5 · 2^-9 → 2 · 2^-9.
  EXPECT_EQ(float_to_e4m3(std::ldexp(0.5f, -9)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -9)), 0x02);
  // Just below a tie rounds down, just above up.
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.1875f, 0.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xFE);
}

TEST(Fp8MlaRow, SizesOfTheNamedShapes) {
  EXPECT_EQ((RowGeometry{512, 64}.bytes()), 656);  // DeepSeek-V3 / GLM-4.7-Flash / GLM-5
  EXPECT_EQ((RowGeometry{512, 0}.bytes()), 528);   // GLM-5.3-Flash's NoPE DSA layers
  EXPECT_EQ((RowGeometry{512, 64}.rope_offset()), 528);
  EXPECT_EQ((RowGeometry{32, 16}.bytes()), 80);     // 32 + 4 + 32 = 68, padded to 16
  EXPECT_EQ((RowGeometry{200, 8}.tiles()), 2);      // a partial last tile
}

uint32_t u32_at(const std::vector<uint8_t>& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

// Latent 256 (two tiles) + rope 4. Tile 0 has amax 448, so its scale is exactly 1 and its codes are the values'
// own; tile 1 is all zero, so its scale is FLT_MIN and its codes zero.
TEST(Fp8MlaRow, KnownVectorByteForByte) {
  const RowGeometry g{256, 4};
  std::vector<float> v(260, 0.0f);
  v[0] = 448.0f, v[1] = -1.0f, v[2] = 0.5f, v[3] = std::ldexp(3.0f, -9), v[127] = -448.0f;
  v[256] = 1.0f, v[257] = -2.0f, v[258] = 0.5f, v[259] = 3.0f;
  std::vector<uint8_t> row(static_cast<size_t>(g.bytes()), 0xAA);
  encode_row(g, v.data(), row.data());
  ASSERT_EQ(row.size(), 272u);
  EXPECT_EQ(row[0], 0x7E);
  EXPECT_EQ(row[1], 0xB8);
  EXPECT_EQ(row[2], 0x30);
  EXPECT_EQ(row[3], 0x03);
  EXPECT_EQ(row[4], 0x00);
  EXPECT_EQ(row[127], 0xFE);
  for (int i = 128; i < 256; ++i) EXPECT_EQ(row[i], 0x00) << i;
  EXPECT_EQ(u32_at(row, 256), 0x3F800000u);  // 1.0f
  EXPECT_EQ(u32_at(row, 260), 0x00800000u);  // FLT_MIN
  const uint8_t rope[8] = {0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F, 0x40, 0x40};  // bf16 1, −2, 0.5, 3 little-endian
  for (int i = 0; i < 8; ++i) EXPECT_EQ(row[264 + i], rope[i]) << i;
  std::vector<float> back(260);
  decode_row(g, row.data(), back.data());
  EXPECT_EQ(back, v);  // every value above is exact in its format
}

// Random rows: each latent value within half a step of its tile's grid — 2^-4 of itself in the normal range, half
// a subnormal step (2^-10 · scale) below it; the rope part within bf16's half step, 2^-8 of itself.
TEST(Fp8MlaRow, QuantizationErrorWithinHalfAStep) {
  const RowGeometry g{512, 64};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(576), back(576);
  std::vector<uint8_t> row(static_cast<size_t>(g.bytes()));
  double worst_rel = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const float spread = std::ldexp(1.0f, trial % 40 - 20);
    for (float& x : v) x = spread * normal(rng);
    encode_row(g, v.data(), row.data());
    decode_row(g, row.data(), back.data());
    for (int t = 0; t < 4; ++t) {
      float scale;
      std::memcpy(&scale, row.data() + 512 + 4 * t, 4);
      float amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[128 * t + i]));
      EXPECT_EQ(scale, std::max(amax / 448.0f, FLT_MIN));
      for (int i = 128 * t; i < 128 * t + 128; ++i) {
        const double err = std::fabs(back[i] - v[i]);
        EXPECT_LE(err, std::max(std::ldexp(std::fabs(v[i]), -4), std::ldexp(scale, -10)) * (1 + 1e-6)) << i;
        if (std::fabs(v[i]) > std::ldexp(scale, -6)) worst_rel = std::max(worst_rel, err / std::fabs(v[i]));
      }
    }
    for (int i = 512; i < 576; ++i) EXPECT_LE(std::fabs(back[i] - v[i]), std::ldexp(std::fabs(v[i]), -8)) << i;
  }
  EXPECT_GT(worst_rel, 0.05);  // the bound is met, not loosely: e4m3's half step is 6.25 %
}

}  // namespace
}  // namespace kiln::fp8mla

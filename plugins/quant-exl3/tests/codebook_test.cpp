// The three codebooks against the check values and RMS of specs/exl3.md §4, and the fp16 conversions they rest on.
#include <gtest/gtest.h>

#include <cmath>

#include "exl3_codebook.h"
#include "exl3_half.h"

namespace kiln::exl3 {
namespace {

struct Expected {
  Codebook cb;
  float values[5];
  double rms;
  double rms_tolerance;  // the spec prints RMS to 6 (3INST) or 5 significant digits
};

TEST(Exl3Codebook, CheckValuesAndRmsOverAllStates) {
  const uint32_t states[5] = {0, 1, 2, 0x1234, 0xFFFF};
  const Expected expected[] = {
      {Codebook::k3Inst, {0.768066f, -0.919434f, 0.931641f, -2.199219f, -0.158203f}, 1.24371, 5e-6},
      {Codebook::kMcg, {1.84375f, 0.134521f, -0.759277f, 1.514648f, 0.850098f}, 1.2441, 5e-5},
      {Codebook::kMul1, {-3.453125f, 0.641113f, -0.448486f, -0.577148f, -0.651367f}, 1.0003, 5e-5},
  };
  for (const Expected& e : expected) {
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR(decode_state(states[i], e.cb), e.values[i], 1e-6)  // the spec prints 6 decimals
          << codebook_name(e.cb) << " state " << states[i];
    double sum = 0;
    for (uint32_t s = 0; s < 65536; ++s) {
      const double v = decode_state(s, e.cb);
      ASSERT_TRUE(std::isfinite(v)) << codebook_name(e.cb) << " state " << s;
      sum += v * v;
    }
    EXPECT_NEAR(std::sqrt(sum / 65536), e.rms, e.rms_tolerance) << codebook_name(e.cb);
  }
}

TEST(Exl3Codebook, OnlyTheLow16BitsOfTheStateMatter) {
  for (Codebook cb : {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1})
    for (uint32_t s : {0u, 7u, 0x1234u, 0xFFFFu}) EXPECT_EQ(decode_state_bits(s, cb), decode_state_bits(s | 0xABC0000u, cb));
}

TEST(Exl3Half, ConversionsRoundTripAndRoundToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF)) continue;  // NaN payloads need not survive
    EXPECT_EQ(float_to_half(half_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC931), -10.3828125f);
  EXPECT_EQ(half_to_float(0x1EEE), 0.00676727294921875f);
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3C00);                  // tie → even
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3C02);                  // tie → even (up)
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);               // half the smallest subnormal: tie → 0
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);               // 1.5 units → 2
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);                            // rounds past the largest finite
  EXPECT_EQ(float_to_half(-65504.0f), 0xFBFF);
}

}  // namespace
}  // namespace kiln::exl3

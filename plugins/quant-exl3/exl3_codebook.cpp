#include "exl3_codebook.h"

#include <cmath>

#include "exl3_half.h"

namespace kiln::exl3 {
namespace {

// 3INST and MCG: a multiplicative hash whose two 16-bit halves are forced (mask, then XOR) into fp16 values of
// magnitude [2^−3, 2), summed. Their exponents differ by at most 3, so the fp32 sum is exact and the one rounding
// to fp16 equals the device's fp16 add.
uint16_t sum_of_halves(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const float sum = half_to_float(static_cast<uint16_t>(x & 0xFFFFu)) + half_to_float(static_cast<uint16_t>(x >> 16));
  return float_to_half(sum);
}

}  // namespace

const char* codebook_name(Codebook cb) {
  switch (cb) {
    case Codebook::k3Inst: return "3INST";
    case Codebook::kMcg: return "MCG";
    case Codebook::kMul1: return "MUL1";
  }
  return "?";
}

uint16_t decode_state_bits(uint32_t state, Codebook cb) {
  const uint32_t s = state & 0xFFFFu;
  switch (cb) {
    case Codebook::k3Inst: return sum_of_halves(s * 89226354u + 64248484u);
    case Codebook::kMcg: return sum_of_halves(s * kMcgMultiplier);
    case Codebook::kMul1: {
      const uint32_t x = s * kMul1Multiplier;
      const uint32_t bytes = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
      // fp16 fma(1024 + S, 0x1EEE, 0xC931) with one rounding: the product needs 22 significant bits and the sum 23,
      // so fmaf is exact and the only rounding is the final one to fp16, as on the device.
      const float h = 1024.0f + static_cast<float>(bytes);
      return float_to_half(std::fma(h, half_to_float(0x1EEE), half_to_float(0xC931)));
    }
  }
  return 0;
}

float decode_state(uint32_t state, Codebook cb) { return half_to_float(decode_state_bits(state, cb)); }

}  // namespace kiln::exl3

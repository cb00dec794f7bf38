#include "exl3_half.h"

#include <bit>
#include <cmath>

namespace kiln::exl3 {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal: man · 2^−24, exact in float.
  const float v = std::ldexp(static_cast<float>(man), -24);
  return sign ? -v : v;
}

uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u);  // inf, nan
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): the value in units of 2^−24, rounded to nearest even. Exact in float
    // arithmetic because scaling by a power of two and rint are exact here.
    const float scaled = std::ldexp(std::bit_cast<float>(abs), 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: drop 13 mantissa bits with round to nearest even (a carry into the exponent is the right result).
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t lsb = (rebased >> 13) & 1u;
  return sign | static_cast<uint16_t>((rebased + 0xFFFu + lsb) >> 13);
}

}  // namespace kiln::exl3

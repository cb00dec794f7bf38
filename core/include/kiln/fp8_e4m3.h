// float8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities, S.1111.111 the
// only NaN; largest finite 448, smallest normal 2^-6, subnormals m · 2^-9). Host code, shared by the core (the DSA
// indexer's fp8 key rows, kiln/indexer_keys.h) and plugins (kv-fp8mla's latent rows); CUDA code converts with the
// hardware's cvt instructions, which round the same way (to nearest, ties to even).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln {

inline constexpr float kE4m3Max = 448.0f;

// Round to nearest, ties to even; magnitudes above 448 saturate to ±448 (the layout's scale keeps |x / scale| ≤ 448,
// so saturation only absorbs the division's last-bit overshoot); NaN stays NaN.
inline uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  float a = std::fabs(x);
  if (a >= kE4m3Max) return static_cast<uint8_t>(sign | 0x7E);
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (8 steps reach the smallest normal, code 0x08)
    const float steps = std::nearbyint(a * 512.0f);  // exact scaling by a power of two; nearbyint rounds to even
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(steps));
  }
  int e = 0;
  const float frac = std::frexp(a, &e);  // a = frac · 2^e, frac ∈ [0.5, 1)
  int m = static_cast<int>(std::nearbyint((frac * 2.0f - 1.0f) * 8.0f));  // exact: frac · 16 − 8 has ≤ 24 bits
  int exponent = e - 1 + 7;
  if (m == 8) m = 0, ++exponent;
  return static_cast<uint8_t>(sign | (exponent << 3) | m);
}

inline float e4m3_to_float(uint8_t v) {
  const int exponent = (v >> 3) & 0xF, m = v & 0x7;
  float a;
  if (exponent == 0xF && m == 0x7) {
    a = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    a = std::ldexp(static_cast<float>(m), -9);
  } else {
    a = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, exponent - 7);
  }
  return (v & 0x80) ? -a : a;
}

}  // namespace kiln

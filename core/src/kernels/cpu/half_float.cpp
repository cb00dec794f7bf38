#include "kernels/cpu/half_float.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t float_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return sign | (magnitude > 0x7f800000u ? 0x7e00 : 0x7c00);
  // 65520 is halfway between the largest fp16 (65504, odd mantissa) and 2^16: ties-to-even overflows.
  if (magnitude >= 0x477ff000u) return sign | 0x7c00;
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the result is subnormal: its mantissa is |f|·2^24 rounded (nearbyint = ties to even);
    // 1024 rounds up into the smallest normal, which is the correct encoding too.
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

void bf16_to_float(const uint16_t* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void float_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

void fp16_to_float(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

void float_to_fp16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

int bf16_terms(const float* x, int64_t n, uint16_t* terms) {
  int used = 1;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t hi = float_to_bf16(x[i]);
    const float r = x[i] - bf16_to_float(hi);  // exact: within half a bf16 step of x, on x's fp32 grid
    const uint16_t lo = float_to_bf16(r);
    const float r2 = r - bf16_to_float(lo);  // exact likewise
    const uint16_t lo2 = float_to_bf16(r2);
    if (!std::isfinite(x[i]) || bf16_to_float(lo2) != r2) return 0;
    if (r2 != 0.f)
      used = 3;
    else if (r != 0.f)
      used = std::max(used, 2);
    terms[i] = hi, terms[n + i] = lo, terms[2 * n + i] = lo2;
  }
  return used;
}

}  // namespace kiln::cpu

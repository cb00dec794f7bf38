// bf16 / fp16 <-> fp32 conversions on raw 16-bit patterns (checkpoint tensors, the bf16 KV cache).
// fp32 -> 16-bit rounds to nearest, ties to even, as torch's .to(bfloat16/float16) does.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln::cpu {

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // any NaN -> the canonical quiet NaN (as torch)
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// f stored to and reloaded from a bf16 buffer: the nearest bf16 value (ties to even), in fp32.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// x[i] as the sum of up to three bf16 terms, exactly: terms[i] = the bf16 nearest x[i], terms[n + i] the bf16
// nearest what is left, terms[2n + i] the rest (8 + 8 + 8 significand bits). That holds every fp32 value from about
// 2⁻¹⁰⁹ in magnitude (below it the rest falls under bf16's smallest subnormal, 2⁻¹³³) up to 0x7f7f8000 (from there
// the nearest bf16 is inf), and zero. Returns how many term planes carry a nonzero value (1 for bf16 values; planes
// past it are zero), or 0 where some x[i] has no such sum (outside that range, inf, NaN): then `terms` is
// unspecified.
int bf16_terms(const float* x, int64_t n, uint16_t* terms);

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);

void bf16_to_float(const uint16_t* in, float* out, int64_t n);
void float_to_bf16(const float* in, uint16_t* out, int64_t n);
// x[i] = round_to_bf16(x[i]) in place.
void round_to_bf16(float* x, int64_t n);
void fp16_to_float(const uint16_t* in, float* out, int64_t n);
void float_to_fp16(const float* in, uint16_t* out, int64_t n);

}  // namespace kiln::cpu

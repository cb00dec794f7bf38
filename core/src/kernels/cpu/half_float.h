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

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);

void bf16_to_float(const uint16_t* in, float* out, int64_t n);
void float_to_bf16(const float* in, uint16_t* out, int64_t n);
// x[i] = round_to_bf16(x[i]) in place.
void round_to_bf16(float* x, int64_t n);
void fp16_to_float(const uint16_t* in, float* out, int64_t n);
void float_to_fp16(const float* in, uint16_t* out, int64_t n);

}  // namespace kiln::cpu

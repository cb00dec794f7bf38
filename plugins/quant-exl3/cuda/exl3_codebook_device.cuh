// The three EXL3 codebooks on the device: a 16-bit state → the fp16 value, the same bits as the CPU reference's
// decode_state_bits (exl3_codebook.cpp). 3INST/MCG: the fp16 add of the two masked halves rounds once, like the
// CPU's exact fp32 sum rounded to fp16; MUL1: fp32 fma (exact) rounded once to fp16.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::exl3::cuda {

enum : int { kCb3Inst = 0, kCbMcg = 1, kCbMul1 = 2 };  // exl3::Codebook's order

__device__ __forceinline__ __half decode_state_half(uint32_t s, int cb) {
  if (cb == kCbMul1) {
    const uint32_t x = s * 0x83DCD12Du;
    const uint32_t bytes = __dp4a(x, 0x01010101u, 0u);  // the sum of x's four unsigned bytes
    return __float2half_rn(fmaf(1024.0f + static_cast<float>(bytes), 0.00676727294921875f, -10.3828125f));
  }
  uint32_t x = cb == kCbMcg ? s * 0xCBAC1FEDu : s * 89226354u + 64248484u;
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const __half lo = __ushort_as_half(static_cast<unsigned short>(x & 0xFFFFu));
  const __half hi = __ushort_as_half(static_cast<unsigned short>(x >> 16));
  return __hadd(lo, hi);
}

__device__ __forceinline__ float decode_state(uint32_t s, int cb) { return __half2float(decode_state_half(s, cb)); }

}  // namespace kiln::exl3::cuda

// How the append kernels store a row, shared by the plain and the fused append so a row has the same bytes whichever
// wrote it — and the bytes of the host codec (fp8_mla_row.cpp).
#pragma once

#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <cstring>

namespace kiln::fp8mla {

// fp32 → bf16 as the host codec rounds: nearest even, a NaN kept a quiet NaN of the same sign and top payload bits.
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN, as the host
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline constexpr int kTileThreads = 128;  // one thread per value of a 128-value tile

// One 128-value latent tile quantized by a block of kTileThreads threads, thread i holding value i (v = 0 past the
// latent, `valid` false): the tile's amax over the block, scale = max(amax / 448, FLT_MIN), dst[i] = the e4m3 code of
// v / scale (IEEE division, saturating), the scale stored by thread 0. warp_amax: kTileThreads / 32 floats of shared
// memory, free again on return. Called by every thread of the block.
__device__ __forceinline__ void quantize_tile(float v, bool valid, float* warp_amax, uint8_t* dst_value,
                                              uint8_t* dst_scale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float amax = fabsf(v);
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = warp_amax[0];
  for (int w = 1; w < kTileThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  __syncthreads();  // warp_amax is read before the next tile writes it
  const float scale = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
  if (valid) *dst_value = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3));
  if (threadIdx.x == 0) memcpy(dst_scale, &scale, 4);
}

}  // namespace kiln::fp8mla

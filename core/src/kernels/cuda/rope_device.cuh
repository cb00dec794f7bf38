// The interleaved rotary embedding of one (token, head) slice by one warp, shared by the RoPE kernel and the
// fused kernels that rope on the way (runtime/cuda/mla_rope_cache_write.cu), so they round exactly alike.
#pragma once

#include "kernels/cuda/launch_check.cuh"
#include "kiln/cuda/mla_append_row.cuh"  // rope_pair

namespace kiln::cuda {

inline constexpr int kRopeMaxPairsPerLane = 2;  // rotary_dim ≤ 128

__device__ __forceinline__ float rope_load(const float* p) { return *p; }
__device__ __forceinline__ float rope_load(const uint16_t* p) { return bf16_bits_to_float(*p); }
__device__ __forceinline__ void rope_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void rope_store(uint16_t* p, float v) { *p = float_to_bf16_bits(v); }

// In place, called by all 32 lanes of a warp: pairs (v[2i], v[2i+1]) rotated by frequency i < half and written
// de-interleaved (v[i], v[half + i]). Every lane reads its pairs before any lane writes, so the in-place
// de-interleaving cannot read an overwritten value.
template <class T>
__device__ __forceinline__ void rope_slice_warp(T* v, float position, const float* __restrict__ inv_freq,
                                                float attention_factor, int half, int lane) {
  float even[kRopeMaxPairsPerLane], odd[kRopeMaxPairsPerLane];
#pragma unroll
  for (int k = 0; k < kRopeMaxPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      even[k] = rope_load(v + 2 * i);
      odd[k] = rope_load(v + 2 * i + 1);
    }
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kRopeMaxPairsPerLane; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      float lo, hi;
      rope_pair(even[k], odd[k], position, inv_freq[i], attention_factor, lo, hi);
      rope_store(v + i, lo);
      rope_store(v + half + i, hi);
    }
  }
}

}  // namespace kiln::cuda

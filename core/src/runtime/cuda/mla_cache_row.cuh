// One token's MLA latent cache write by one block, shared by mla_write_cache and the fused rope + cache-write
// kernel (mla_rope_cache_write.cu), so both reduce and round exactly alike.
#pragma once

#include "kernels/cuda/launch_check.cuh"
#include "kiln/cuda/norm_scale.cuh"
#include "runtime/cuda/block_reduce.cuh"

namespace kiln::cuda {

// The block size both launch with: the norm's sum of squares is split over this many threads.
inline constexpr int kMlaCacheRowThreads = 128;

// dst[0:L] = bf16(rmsnorm(row[0:L]) · w), dst[L:L+R] = bf16(row[L:L+R]); w == null: dst[0:L] = bf16(row[0:L]) (a row
// already normalised). Called by every thread of the block.
__device__ __forceinline__ void mla_write_cache_row(const float* row, int64_t L, int64_t R, const uint16_t* w,
                                                    float eps, uint16_t* dst) {
  if (w == nullptr) {
    for (int64_t i = threadIdx.x; i < L + R; i += blockDim.x) dst[i] = float_to_bf16_bits(row[i]);
    return;
  }
  __shared__ double red[32];
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) ss += square_f64(row[i]);
  const float inv = inverse_rms(block_sum_f64(ss, red), L, eps);
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) dst[i] = float_to_bf16_bits(row[i] * inv * bf16_bits_to_float(w[i]));
  for (int64_t i = threadIdx.x; i < R; i += blockDim.x) dst[L + i] = float_to_bf16_bits(row[L + i]);
}

// row[0:L] = rmsnorm(row[0:L]) · w in fp32, in place (what mla_write_cache_row stores before its rounding), for
// layouts that take final rows. Called by every thread of the block.
__device__ __forceinline__ void mla_normalize_row(float* row, int64_t L, const uint16_t* w, float eps) {
  __shared__ double red[32];
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) ss += square_f64(row[i]);
  const float inv = inverse_rms(block_sum_f64(ss, red), L, eps);
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) row[i] = row[i] * inv * bf16_bits_to_float(w[i]);
}

}  // namespace kiln::cuda

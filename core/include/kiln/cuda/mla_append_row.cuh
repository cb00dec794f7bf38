// The MLA append prologue one block runs for one token: RoPE on the query heads' and the latent's rope parts, the
// latent's RMSNorm, the queries' bf16 copy and absorbed tail — the pieces of the core's fused rope + cache-write
// kernel (runtime/cuda/mla_rope_cache_write.cu), in the SDK so a KV layout that fuses the prologue into its append
// (KvAppendFusion: kKvFuseNormRope | kKvFuseQueries) starts from the same fp32 values, bit for bit, as the core
// hands a layout that stores final rows. Why it matters: a layout whose fused and unfused appends differ would make
// a prompt's cache depend on which path wrote it.
//
// Block shape: kMlaAppendThreads threads; block (t, h < heads) finishes query head h of token t, block (t, heads)
// the latent row. Thread i holds latent elements i + j·kMlaAppendThreads (j < kPer) in registers — the same
// element ↔ thread map and summation order as the core's kernel — so latent ≤ kPer · kMlaAppendThreads.
#pragma once

#include <cstdint>

#include "kiln/cuda/bf16_bits.cuh"
#include "kiln/cuda/norm_scale.cuh"

namespace kiln::cuda {

inline constexpr int kMlaAppendThreads = 128;
inline constexpr int kMlaAppendLatentPerThread = 8;  // latent ≤ 1,024

// Frequency i's pair (even, odd) rotated: lo is stored at v[i], hi at v[half + i] (interleaved in, de-interleaved
// out). Same rounding as the CPU: fp32 angle, fp64 cos/sin rounded once, then the fp32 attention factor.
__device__ __forceinline__ void rope_pair(float even, float odd, float position, float inv_freq_i,
                                          float attention_factor, float& lo, float& hi) {
  const double angle = static_cast<double>(position * inv_freq_i);
  const float c = static_cast<float>(cos(angle)) * attention_factor;
  const float s = static_cast<float>(sin(angle)) * attention_factor;
  lo = even * c - odd * s;
  hi = odd * c + even * s;
}

// Block-wide fp64 sum (norm scales, norm_scale.cuh); every thread gets the result. `shared` holds ≥ 32 doubles.
__device__ inline double block_sum_f64(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Query head of one token: v = q[t, h] (fp32, nope then rope values) gets RoPE on its rope part in place (half
// pairs; half = 0: none), vb = bf16(v) (what the absorption reads), pe = the rope part (the absorbed query's tail).
// Called by every thread of the block.
__device__ __forceinline__ void mla_append_query_head(float* v, uint16_t* vb, float* pe, int64_t nope, int64_t rope,
                                                      float position, const float* inv_freq, float attention_factor,
                                                      int half) {
  const int tid = static_cast<int>(threadIdx.x);
  const bool pair = tid < half;
  float lo = 0.f, hi = 0.f;
  if (pair) rope_pair(v[nope + 2 * tid], v[nope + 2 * tid + 1], position, inv_freq[tid], attention_factor, lo, hi);
#pragma unroll 4
  for (int64_t i = tid; i < nope; i += blockDim.x) vb[i] = float_to_bf16_bits(v[i]);
  if (half == 0) {  // no RoPE: the rope part as given
    for (int64_t i = tid; i < rope; i += blockDim.x) {
      const float r = v[nope + i];
      vb[nope + i] = float_to_bf16_bits(r);
      pe[i] = r;
    }
    return;
  }
  __syncthreads();  // every pair read before any is overwritten in place
  if (pair) {
    v[nope + tid] = lo;
    v[nope + half + tid] = hi;
    vb[nope + tid] = float_to_bf16_bits(lo);
    vb[nope + half + tid] = float_to_bf16_bits(hi);
    pe[tid] = lo;
    pe[half + tid] = hi;
  }
}

// The latent row's first half: x[j] = row[i], w[j] = the norm weight (0 without one), for i = tid + j·threads <
// latent, every load issued at once; the rope pair tid < half rotated into lo, hi and written back to the row in
// place (row[latent + tid], row[latent + half + tid]), as the roped fp32 row. Called by every thread of the block.
template <int kPer>
__device__ __forceinline__ void mla_append_latent_load_rope(float* row, int64_t latent, const uint16_t* norm_weight,
                                                            float position, const float* inv_freq,
                                                            float attention_factor, int half, float (&x)[kPer],
                                                            float (&w)[kPer], float& lo, float& hi) {
  const int tid = static_cast<int>(threadIdx.x);
  const bool pair = tid < half;
  lo = 0.f, hi = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = tid + static_cast<int64_t>(j) * kMlaAppendThreads;
    x[j] = i < latent ? row[i] : 0.f;
    w[j] = norm_weight && i < latent ? bf16_bits_to_float(norm_weight[i]) : 0.f;
  }
  if (pair) rope_pair(row[latent + 2 * tid], row[latent + 2 * tid + 1], position, inv_freq[tid], attention_factor, lo,
                      hi);
  if (half > 0) {
    __syncthreads();  // every pair read before any is overwritten in place
    if (pair) {
      row[latent + tid] = lo;
      row[latent + half + tid] = hi;
    }
  }
}

// The RMSNorm's scale of the loaded latent: 1 / rms in fp32 as the CPU computes it (norm_scale.cuh); 1 without a
// norm weight. The normalised value of element j is then x[j] * inv * w[j]. Called by every thread of the block.
template <int kPer>
__device__ __forceinline__ float mla_append_latent_scale(int64_t latent, bool has_norm, float eps,
                                                         const float (&x)[kPer]) {
  if (!has_norm) return 1.f;
  __shared__ double red[32];
  const int tid = static_cast<int>(threadIdx.x);
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (tid + static_cast<int64_t>(j) * kMlaAppendThreads < latent) ss += square_f64(x[j]);
  return inverse_rms(block_sum_f64(ss, red), latent, eps);
}

}  // namespace kiln::cuda

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

// Frequency i's cos / sin at `position`, with the CPU's rounding: fp32 angle, fp64 cos/sin rounded once, then the
// fp32 attention factor. Kernels that rotate many heads of one token compute these once and rope_rotate each pair.
__device__ __forceinline__ void rope_cos_sin(float position, float inv_freq_i, float attention_factor, float& c,
                                             float& s) {
  const double angle = static_cast<double>(position * inv_freq_i);
  c = static_cast<float>(cos(angle)) * attention_factor;
  s = static_cast<float>(sin(angle)) * attention_factor;
}

// The pair (even, odd) rotated by (c, s): lo is stored at v[i], hi at v[half + i] (interleaved in, de-interleaved
// out).
__device__ __forceinline__ void rope_rotate(float even, float odd, float c, float s, float& lo, float& hi) {
  lo = even * c - odd * s;
  hi = odd * c + even * s;
}

// Frequency i's pair (even, odd) rotated (rope_cos_sin, then rope_rotate).
__device__ __forceinline__ void rope_pair(float even, float odd, float position, float inv_freq_i,
                                          float attention_factor, float& lo, float& hi) {
  float c, s;
  rope_cos_sin(position, inv_freq_i, attention_factor, c, s);
  rope_rotate(even, odd, c, s, lo, hi);
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
// pe null: vb alone (v is left unroped). Called by every thread of the block.
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
      if (pe) pe[i] = r;
    }
    return;
  }
  __syncthreads();  // every pair read before any is overwritten in place
  if (pair) {
    vb[nope + tid] = float_to_bf16_bits(lo);
    vb[nope + half + tid] = float_to_bf16_bits(hi);
    if (pe) {  // null: bf16 only (kKvFuseQueriesBf16Only), no fp32 forms
      v[nope + tid] = lo;
      v[nope + half + tid] = hi;
      pe[tid] = lo;
      pe[half + tid] = hi;
    }
  }
}

// The prefill form of the queries: one block takes hs query heads of one token where mla_append_query_head takes
// one. Why: one-head blocks are 256 values each, scalar loads and stores behind a barrier — at a 4K-token chunk of
// GLM-4.7-Flash 86K of them, 166 µs a layer on an H100 for ~55 µs of bytes. Here the token's rope angles are
// computed once (not once per head), each thread loads its float4 chunks of q before any store (the rope part is
// rewritten in place), and stores are vectors. Same arithmetic (rope_cos_sin + rope_rotate are rope_pair), so the
// same bits as mla_append_query_head: a token's rows do not depend on which form ran.
inline constexpr int kMlaAppendWideChunks = 8;         // float4 chunks of q a thread holds
inline constexpr int64_t kMlaAppendWideMinRows = 128;  // below this the one-head blocks are more parallel

// Heads a block of the wide form takes (groups as even as they come), or 0 where it does not apply: fewer than
// kMlaAppendWideMinRows rows, no RoPE (roped = positions given), or widths / pointers its vector accesses cannot
// take (float4 chunks never straddle nope | rope; rope pairs come two to a chunk).
__host__ __device__ inline int64_t mla_append_wide_heads(int64_t n, int64_t heads, int64_t nope, int64_t rope,
                                                         int64_t latent, bool roped, const void* q, const void* q_bf,
                                                         const void* q_abs) {
  auto aligned = [](const void* p, uintptr_t b) { return reinterpret_cast<uintptr_t>(p) % b == 0; };
  if (n < kMlaAppendWideMinRows || heads <= 0 || !roped || rope <= 0 || rope % 4 != 0 || rope / 2 > 64 ||
      nope % 4 != 0 || latent % 2 != 0 || !aligned(q, 16) || !aligned(q_bf, 8) || !aligned(q_abs, 8))
    return 0;
  const int64_t most = int64_t{kMlaAppendWideChunks} * kMlaAppendThreads / ((nope + rope) / 4);  // heads a block holds
  if (most == 0) return 0;
  const int64_t groups = (heads + most - 1) / most;
  return (heads + groups - 1) / groups;
}

// Query heads h0 .. h0 + hs − 1 of one token in one block of kMlaAppendThreads: q / q_bf point at head h0's row of
// the token (rows nope + rope apart), q_abs at head h0's absorbed row (rows latent + rope apart); per head as
// mla_append_query_head with RoPE on (half = rope / 2 pairs). Called by every thread of the block. q_abs null: only
// q_bf is written (q is left unroped) — a step that attends in the expanded prefill form alone reads nothing else
// (kKvFuseQueriesBf16Only), and the fp32 forms were a third of the kernel's bytes.
__device__ inline void mla_append_query_heads(float* q, uint16_t* q_bf, float* q_abs, int64_t hs, int64_t nope,
                                              int64_t rope, int64_t latent, float position, const float* inv_freq,
                                              float attention_factor) {
  __shared__ float cs[64], sn[64];
  const int tid = static_cast<int>(threadIdx.x), half = static_cast<int>(rope / 2);
  if (tid < half) rope_cos_sin(position, inv_freq[tid], attention_factor, cs[tid], sn[tid]);
  const int64_t qk = nope + rope, D = latent + rope;
  const int head_chunks = static_cast<int>(qk / 4), nope_chunks = static_cast<int>(nope / 4);
  const int chunks = static_cast<int>(hs) * head_chunks;
  float4 v[kMlaAppendWideChunks];
#pragma unroll
  for (int j = 0; j < kMlaAppendWideChunks; ++j) {
    const int c = tid + j * kMlaAppendThreads;
    if (c < chunks) v[j] = reinterpret_cast<const float4*>(q)[c];
  }
  __syncthreads();  // the angles are in; every chunk is read before a rope value is written back in place
  auto bf2 = [](float a, float b) {
    return static_cast<uint32_t>(float_to_bf16_bits(a)) | (static_cast<uint32_t>(float_to_bf16_bits(b)) << 16);
  };
#pragma unroll
  for (int j = 0; j < kMlaAppendWideChunks; ++j) {
    const int c = tid + j * kMlaAppendThreads;
    if (c >= chunks) continue;
    const int hh = c / head_chunks, cc = c % head_chunks;
    uint16_t* const vb = q_bf + hh * qk;
    if (cc < nope_chunks) {
      *reinterpret_cast<uint2*>(vb + 4 * cc) = make_uint2(bf2(v[j].x, v[j].y), bf2(v[j].z, v[j].w));
      continue;
    }
    const int i = 2 * (cc - nope_chunks);  // the chunk holds pairs i and i + 1
    float lo0, hi0, lo1, hi1;
    rope_rotate(v[j].x, v[j].y, cs[i], sn[i], lo0, hi0);
    rope_rotate(v[j].z, v[j].w, cs[i + 1], sn[i + 1], lo1, hi1);
    *reinterpret_cast<uint32_t*>(vb + nope + i) = bf2(lo0, lo1);
    *reinterpret_cast<uint32_t*>(vb + nope + half + i) = bf2(hi0, hi1);
    if (q_abs == nullptr) continue;  // bf16 queries only: no fp32 forms
    float* const r = q + hh * qk + nope;
    *reinterpret_cast<float2*>(r + i) = make_float2(lo0, lo1);
    *reinterpret_cast<float2*>(r + half + i) = make_float2(hi0, hi1);
    float* const pe = q_abs + hh * D + latent;
    *reinterpret_cast<float2*>(pe + i) = make_float2(lo0, lo1);
    *reinterpret_cast<float2*>(pe + half + i) = make_float2(hi0, hi1);
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

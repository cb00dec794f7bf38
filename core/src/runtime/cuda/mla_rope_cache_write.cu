#include "runtime/cuda/mla_rope_cache_write.h"

#include <string>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_device.cuh"
#include "runtime/cuda/mla_cache_row.cuh"

namespace kiln::cuda {
namespace {

// Latent values a thread of the register form holds (latent ≤ kLatentPerThread · kMlaCacheRowThreads).
constexpr int kLatentPerThread = kMlaAppendLatentPerThread;
static_assert(kMlaCacheRowThreads == kMlaAppendThreads, "the SDK's append pieces map elements to this block size");

// Block (t, h < heads): query head h of token t; block (t, heads): token t's latent. The general form: warp 0
// ropes the slice in place as the RoPE kernel does; after the barrier the block reads the roped values back (its
// own writes) and writes the row as mla_write_cache does.
__device__ void rope_cache_write_general(const MlaRopeCacheWrite& a, int64_t t, int64_t h, float position,
                                         int half) {
  const int64_t qk = a.nope + a.rope, D = a.latent + a.rope;
  if (h < a.heads) {
    float* v = a.q + (t * a.heads + h) * qk;
    if (threadIdx.x < 32 && half > 0) rope_slice_warp(v + a.nope, position, a.inv_freq, a.attention_factor, half,
                                                      static_cast<int>(threadIdx.x));
    __syncthreads();
    uint16_t* vb = a.q_bf + (t * a.heads + h) * qk;
    for (int64_t i = threadIdx.x; i < qk; i += blockDim.x) vb[i] = float_to_bf16_bits(v[i]);
    if (!a.q_abs) return;  // bf16 queries only (q stays roped in place here: unspecified to the caller)
    float* pe = a.q_abs + (t * a.heads + h) * D + a.latent;
    for (int64_t i = threadIdx.x; i < a.rope; i += blockDim.x) pe[i] = v[a.nope + i];
    return;
  }
  float* row = a.ckv + t * (a.ckv_stride > 0 ? a.ckv_stride : D);
  if (threadIdx.x < 32 && half > 0)
    rope_slice_warp(row + a.latent, position, a.inv_freq, a.attention_factor, half, static_cast<int>(threadIdx.x));
  __syncthreads();
  if (a.cache == nullptr) {  // finish the row in place for a layout that stores final rows
    if (a.norm_weight) mla_normalize_row(row, a.latent, a.norm_weight, a.eps);
    return;
  }
  if (a.slots[t] < 0) return;  // padding
  mla_write_cache_row(row, a.latent, a.rope, a.norm_weight, a.eps, a.cache + a.slots[t] * D);
}

// The same values and bits with every load issued up front. Why: at decode this kernel is a chain of L2 round trips
// on the critical path of every layer (load, rope, store, barrier, load back, reduce, load again, store). Thread
// p < half takes rope pair p (the angle's fp64 cos/sin overlaps the other loads); each thread keeps its latent
// values in registers, in the element order and summation order of mla_write_cache_row / mla_normalize_row. The
// pieces are the SDK's (kiln/cuda/mla_append_row.cuh), which KV layouts that fuse this prologue call too.
__device__ void rope_cache_write_registers(const MlaRopeCacheWrite& a, int64_t t, int64_t h, float position,
                                           int half) {
  const int64_t qk = a.nope + a.rope, D = a.latent + a.rope;
  const int tid = static_cast<int>(threadIdx.x);
  if (h < a.heads) {
    mla_append_query_head(a.q + (t * a.heads + h) * qk, a.q_bf + (t * a.heads + h) * qk,
                          a.q_abs ? a.q_abs + (t * a.heads + h) * D + a.latent : nullptr, a.nope, a.rope, position,
                          a.inv_freq, a.attention_factor, half);
    return;
  }
  float* row = a.ckv + t * (a.ckv_stride > 0 ? a.ckv_stride : D);
  float x[kLatentPerThread];
  float w[kLatentPerThread];
  float lo, hi;
  mla_append_latent_load_rope(row, a.latent, a.norm_weight, position, a.inv_freq, a.attention_factor, half, x, w, lo,
                              hi);
  const bool store = a.cache != nullptr && a.slots[t] >= 0;
  if (a.cache != nullptr && !store) return;  // padding (the whole block)
  const float inv = mla_append_latent_scale(a.latent, a.norm_weight != nullptr, a.eps, x);
  if (!store) {  // a layout that stores final rows: the normalised latent in place, in fp32
    if (!a.norm_weight) return;
#pragma unroll
    for (int j = 0; j < kLatentPerThread; ++j) {
      const int64_t i = tid + static_cast<int64_t>(j) * kMlaCacheRowThreads;
      if (i < a.latent) row[i] = x[j] * inv * w[j];
    }
    return;
  }
  uint16_t* dst = a.cache + a.slots[t] * D;
#pragma unroll
  for (int j = 0; j < kLatentPerThread; ++j) {
    const int64_t i = tid + static_cast<int64_t>(j) * kMlaCacheRowThreads;
    if (i < a.latent) dst[i] = float_to_bf16_bits(a.norm_weight ? x[j] * inv * w[j] : x[j]);
  }
  if (half > 0) {
    if (tid < half) {
      dst[a.latent + tid] = float_to_bf16_bits(lo);
      dst[a.latent + half + tid] = float_to_bf16_bits(hi);
    }
  } else {
    for (int64_t i = tid; i < a.rope; i += blockDim.x) dst[a.latent + i] = float_to_bf16_bits(row[a.latent + i]);
  }
}

// grid (n, groups + 1): block (t, y < groups) takes query heads y·hs .. of token t, block (t, groups) its latent.
template <bool kRegisters>
__global__ void __launch_bounds__(kMlaCacheRowThreads) mla_rope_cache_write_wide_kernel(MlaRopeCacheWrite a,
                                                                                         int64_t hs) {
  const int64_t t = blockIdx.x, y = blockIdx.y, groups = gridDim.y - 1;
  pdl_wait();
  pdl_launch_dependents();
  const float position = static_cast<float>(a.positions[t]);
  const int half = static_cast<int>(a.rope / 2);
  if (y < groups) {  // the prefill form of the queries (kiln/cuda/mla_append_row.cuh says why)
    const int64_t h0 = y * hs, D = a.latent + a.rope;
    mla_append_query_heads(a.q + (t * a.heads + h0) * (a.nope + a.rope), a.q_bf + (t * a.heads + h0) * (a.nope + a.rope),
                           a.q_abs ? a.q_abs + (t * a.heads + h0) * D : nullptr, min(hs, a.heads - h0), a.nope,
                           a.rope, a.latent, position, a.inv_freq, a.attention_factor);
  } else if constexpr (kRegisters) {
    rope_cache_write_registers(a, t, a.heads, position, half);
  } else {
    rope_cache_write_general(a, t, a.heads, position, half);
  }
}

template <bool kRegisters>
__global__ void __launch_bounds__(kMlaCacheRowThreads) mla_rope_cache_write_kernel(MlaRopeCacheWrite a) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  pdl_wait();
  pdl_launch_dependents();
  // Without positions the rows are already roped (and without a norm weight already normalised).
  const float position = a.positions ? static_cast<float>(a.positions[t]) : 0.0f;
  const int half = a.positions ? static_cast<int>(a.rope / 2) : 0;
  if constexpr (kRegisters)
    rope_cache_write_registers(a, t, h, position, half);
  else
    rope_cache_write_general(a, t, h, position, half);
}

}  // namespace

Status mla_rope_cache_write(const MlaRopeCacheWrite& a, StreamHandle stream) {
  if (a.rope < 0 || a.rope % 2 != 0 || a.rope > 64 * kRopeMaxPairsPerLane)
    return invalid_argument("cuda::mla_rope_cache_write: rope width must be even and in [0, 128], got " +
                            std::to_string(a.rope));
  if (a.heads < 0 || a.heads > 65534 || a.latent <= 0 || a.nope < 0)
    return invalid_argument("cuda::mla_rope_cache_write: need 0 ≤ heads < 65535, latent > 0, nope ≥ 0");
  if (a.heads > 0 && (!a.q || !a.q_bf))
    return invalid_argument("cuda::mla_rope_cache_write: query heads need q and q_bf");
  if (a.ckv_stride != 0 && a.ckv_stride < a.latent + a.rope)
    return invalid_argument("cuda::mla_rope_cache_write: ckv_stride must be 0 or ≥ latent + rope");
  if (a.n == 0) return ok_status();
  const bool registers = a.latent <= int64_t{kLatentPerThread} * kMlaCacheRowThreads;
  if (const int64_t hs = mla_append_wide_heads(a.n, a.heads, a.nope, a.rope, a.latent, a.positions != nullptr, a.q,
                                               a.q_bf, a.q_abs);
      hs > 0) {
    const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((a.heads + hs - 1) / hs + 1));
    return check_cuda(launch_pdl(registers ? mla_rope_cache_write_wide_kernel<true> : mla_rope_cache_write_wide_kernel<false>,
                                 grid, dim3(kMlaCacheRowThreads), 0, stream, a, hs),
                      "cuda::mla_rope_cache_write");
  }
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads + 1));
  return check_cuda(launch_pdl(registers ? mla_rope_cache_write_kernel<true> : mla_rope_cache_write_kernel<false>,
                               grid, dim3(kMlaCacheRowThreads), 0, stream, a),
                    "cuda::mla_rope_cache_write");
}

}  // namespace kiln::cuda

// Device code shared by the MoE gate kernels (moe_gate_gemv.cu, moe_gate_route_group.cu): a group of
// kGateThreads threads computes one expert's logits for every token, in an order that depends on `hidden` only.
#pragma once

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda::moe_detail {

inline constexpr int kGateWarps = 4;
inline constexpr int kGateThreads = kGateWarps * 32;
inline constexpr int kGateTokens = 8;  // tokens sharing each weight load

// A barrier over the kGateThreads threads of named barrier `id` (id 0 in a block of kGateThreads threads is
// __syncthreads).
__device__ __forceinline__ void gate_group_sync(int id) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "n"(kGateThreads) : "memory");
}

// logits[t, e] = x[t, :] · w[e, :] for every token t < n, by the group's threads (`local` = index in the group,
// `s_part` its [kGateWarps][kGateTokens] scratch, `barrier` its named barrier). Thread i owns columns
// 4i + 4·kGateThreads·j (j = 0, 1, ...): it sums their products in that order with fmaf, then the warp sums its
// lanes (xor butterfly) and thread t adds the kGateWarps warp sums of token t in warp order. None of that depends
// on n: the token groups only repeat it.
__device__ __forceinline__ void gate_logits_for_expert(const uint16_t* __restrict__ x, int64_t n, int64_t hidden,
                                                       const float* __restrict__ w, int64_t experts, int64_t e,
                                                       int local, float (*s_part)[kGateTokens], int barrier,
                                                       float* logits) {
  const int warp = local / 32, lane = local % 32;
  const float* we = w + e * hidden;
  for (int64_t t0 = 0; t0 < n; t0 += kGateTokens) {
    const int count = static_cast<int>(n - t0 < kGateTokens ? n - t0 : kGateTokens);
    float acc[kGateTokens] = {};
    if (count == 1) {
      // One token (c1 decode): four rounds of loads in flight together, where the loop below waits for each
      // round's loads before issuing the next (a chain of L2/DRAM round trips). The same fmaf order, so the same
      // bits as the general loop.
#pragma unroll 4
      for (int64_t k = 4 * local; k < hidden; k += 4 * kGateThreads) {
        const float4 wv = __ldg(reinterpret_cast<const float4*>(we + k));
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(x + t0 * hidden + k));
        acc[0] = fmaf(wv.x, __uint_as_float(raw.x << 16), acc[0]);
        acc[0] = fmaf(wv.y, __uint_as_float(raw.x & 0xffff0000u), acc[0]);
        acc[0] = fmaf(wv.z, __uint_as_float(raw.y << 16), acc[0]);
        acc[0] = fmaf(wv.w, __uint_as_float(raw.y & 0xffff0000u), acc[0]);
      }
    } else {
      for (int64_t k = 4 * local; k < hidden; k += 4 * kGateThreads) {
        const float4 wv = __ldg(reinterpret_cast<const float4*>(we + k));
#pragma unroll
        for (int t = 0; t < kGateTokens; ++t) {
          if (t >= count) break;
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(x + (t0 + t) * hidden + k));
          acc[t] = fmaf(wv.x, __uint_as_float(raw.x << 16), acc[t]);
          acc[t] = fmaf(wv.y, __uint_as_float(raw.x & 0xffff0000u), acc[t]);
          acc[t] = fmaf(wv.z, __uint_as_float(raw.y << 16), acc[t]);
          acc[t] = fmaf(wv.w, __uint_as_float(raw.y & 0xffff0000u), acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kGateTokens; ++t) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(~0u, acc[t], off);
      if (lane == 0) s_part[warp][t] = acc[t];
    }
    gate_group_sync(barrier);
    if (local < count) {
      float s = s_part[0][local];
#pragma unroll
      for (int wi = 1; wi < kGateWarps; ++wi) s += s_part[wi][local];
      logits[(t0 + local) * experts + e] = s;
    }
    gate_group_sync(barrier);  // s_part is rewritten by the next token group
  }
}

}  // namespace kiln::cuda::moe_detail

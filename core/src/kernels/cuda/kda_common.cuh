// Device pieces shared by the KDA kernels (kda_decode.cu, kda_prefill.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kda.h"
#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda::kda_detail {

constexpr int kD = 128;  // dk = dv

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

// The per-channel log decay from the raw f_b output (cpu::kda_forget_gate).
__device__ __forceinline__ float forget_gate(float g0, float a, bool has_lower_bound, float lower_bound) {
  if (has_lower_bound) return lower_bound * (1.f / (1.f + expf(-a * g0)));
  const float sp = g0 > 20.f ? g0 : log1pf(expf(g0));
  return -a * sp;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// The short conv's output for one channel, in the CPU reference's order ((w0x0 + w1x1) + w2x2) + w3x3 without FMA
// contraction, then SiLU as x · σ(x): the bf16 rounding that follows then agrees with the reference's almost
// always (a differently rounded sum near a bf16 tie would flip one value by an ulp).
__device__ __forceinline__ float conv_silu(const float (&w)[4], float x0, float x1, float x2, float x3) {
  const float acc = __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(w[0], x0), __fmul_rn(w[1], x1)), __fmul_rn(w[2], x2)),
                              __fmul_rn(w[3], x3));
  return __fmul_rn(acc, __frcp_rn(__fadd_rn(1.f, expf(-acc))));
}

__device__ __forceinline__ float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace kiln::cuda::kda_detail

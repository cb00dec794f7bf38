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

__device__ __forceinline__ float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace kiln::cuda::kda_detail

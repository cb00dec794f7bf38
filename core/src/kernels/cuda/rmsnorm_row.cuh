// The body of one RMSNorm row, shared by norm.cu's kernels and the kernels that end in the next block's norm
// (moe_experts.cu's combine + residual add + RMSNorm), so a fused kernel gives bitwise what the separate launches
// give: the same thread ↔ element map, the same block reduction, the same rounding.
#pragma once

#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {

// For a block of kThreads threads: v[i] = value(i) (already rounded as the block's input is stored); with
// kResidual, v[i] += residual[i] and is stored back (the fp32 residual stream); then
// out[i] = bf16(weight[i] · v[i] · rsqrt(mean(v²) + eps)). The row is re-read from L1/L2 for the scale pass
// (hidden sizes are a few thousand values).
template <int kThreads, bool kResidual, typename Value>
__device__ __forceinline__ void rmsnorm_row(Value value, float* __restrict__ residual,
                                            const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                            uint16_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = value(i);
    if constexpr (kResidual) {
      v += residual[i];
      residual[i] = v;
    }
    sum_sq += v * v;
  }
  const float total = Reduce(temp).Sum(sum_sq);
  if (threadIdx.x == 0) inv_rms = rsqrtf(total / static_cast<float>(dim) + eps);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = kResidual ? residual[i] : value(i);
    out[i] = float_to_bf16_bits(bf16_bits_to_float(weight[i]) * (v * inv_rms));
  }
}

}  // namespace kiln::cuda

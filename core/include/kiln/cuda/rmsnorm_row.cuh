// The body of one RMSNorm row, shared by the core's norm kernels and the kernels that end in the next block's norm
// (the MoE combine + residual add + RMSNorm, in the core and in transport-nccl's fused all-reduce), so a fused kernel
// gives bitwise what the separate launches give: the same thread ↔ element map, the same block reduction, the same
// rounding. In the SDK because a plugin's kernel that ends in the norm must round as the core's does.
#pragma once

#include <cub/block/block_reduce.cuh>

#include "kiln/cuda/bf16_bits.cuh"
#include "kiln/cuda/norm_scale.cuh"

namespace kiln::cuda {

// For a block of kThreads threads: v[i] = value(i) (already rounded as the block's input is stored); with
// kResidual, v[i] += residual[i] and is stored back (the fp32 residual stream); then
// out[i] = bf16(weight[i] · (v[i] · inverse_rms(Σ v², dim, eps))) — the scale as the CPU computes it (norm_scale.cuh). The row is re-read from L1/L2 for the scale pass
// (hidden sizes are a few thousand values). Rows longer than rmsnorm_row_regs takes (kMaxRowValues) use this.
template <int kThreads, bool kResidual, typename Value>
__device__ __forceinline__ void rmsnorm_row(Value value, float* __restrict__ residual,
                                            const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                            uint16_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  double sum_sq = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = value(i);
    if constexpr (kResidual) {
      v += residual[i];
      residual[i] = v;
    }
    sum_sq += square_f64(v);
  }
  const double total = Reduce(temp).Sum(sum_sq);
  if (threadIdx.x == 0) inv_rms = inverse_rms(total, dim, eps);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = kResidual ? residual[i] : value(i);
    out[i] = float_to_bf16_bits(bf16_bits_to_float(weight[i]) * (v * inv_rms));
  }
}

// The values per thread rmsnorm_row_regs keeps in registers at most (so rows up to 32 · kThreads values).
inline constexpr int kMaxRowValues = 32;

// The per-thread value count a row of `dim` values takes in rmsnorm_row_regs: ceil(dim / threads) rounded up to
// 4, 8, 16 or 32; 0 when the row is longer (then rmsnorm_row).
inline int rmsnorm_row_values(int64_t dim, int threads) {
  const int64_t per = (dim + threads - 1) / threads;
  for (int p = 4; p <= kMaxRowValues; p *= 2)
    if (per <= p) return p;
  return 0;
}

// rmsnorm_row with the row held in registers: thread t owns elements t + j·kThreads (j < kPer), the same map,
// the same per-thread summation order and block reduction, so the bits are rmsnorm_row's. Why: a decode step
// normalises one row per layer boundary on one block, and rmsnorm_row's loop waits for each element's loads
// before issuing the next (a chain of L2 round trips, ~6–12 µs a call on the H200); here load(v, valid) issues
// every load of the row at once. load fills v[j] for every j with valid(j) (i = t + j·kThreads < dim).
template <int kThreads, int kPer, bool kResidual, typename Load>
__device__ __forceinline__ void rmsnorm_row_regs(Load load, float* __restrict__ residual,
                                                 const uint16_t* __restrict__ weight, int64_t dim, float eps,
                                                 uint16_t* __restrict__ out) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  float v[kPer], r[kPer];
  uint16_t w[kPer];
  // The weight and residual loads first: they do not depend on load's, so all are in flight together.
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    v[j] = 0.f;
    r[j] = kResidual && i < dim ? residual[i] : 0.f;
    w[j] = i < dim ? weight[i] : uint16_t{0};
  }
  load(v);
  if constexpr (kResidual) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] += r[j];
  }
  double sum_sq = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < dim) {
      if constexpr (kResidual) residual[i] = v[j];
      sum_sq += square_f64(v[j]);
    }
  }
  const double total = Reduce(temp).Sum(sum_sq);
  if (threadIdx.x == 0) inv_rms = inverse_rms(total, dim, eps);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < dim) out[i] = float_to_bf16_bits(bf16_bits_to_float(w[j]) * (v[j] * inv_rms));
  }
}

}  // namespace kiln::cuda

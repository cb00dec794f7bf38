// One token's MoE output combined and carried into the next block's norm, on one block:
//   v[i] = bf16(extra(Σ_k routed(k, i), i))   the routed slots in slot order (fp32), then what extra adds in order
//   residual[i] += v[i] (fp32)                 and normed = bf16(weight · residual · inverse_rms(residual))
// with rmsnorm_row(_regs)'s element map, reduction and rounding. The core's combine kernel reads routed(k, i) from
// its pair rows; transport-nccl's fused all-reduce reads the rank-order sum of every rank's rows. One body, so the
// fused launch gives the bits of all_reduce + the core's kernel (which is what keeps tensor-parallel decoding equal
// to one GPU).
#pragma once

#include <cstdint>

#include "kiln/cuda/bf16_bits.cuh"
#include "kiln/cuda/rmsnorm_row.cuh"

namespace kiln::cuda {

// A shared expert's fp32 output as it enters the combine: rounded to bf16, as the shared expert run apart stores
// it (so a row's sum does not depend on whether the step folded the shared expert into the routed launches).
__device__ __forceinline__ float moe_shared_term(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

// kPer: rmsnorm_row_values(hidden, kThreads) (0: the row does not fit in registers, rmsnorm_row's loop).
// routed(int64_t k, int64_t i) -> float; extra(float sum, int64_t i) -> float (the shared term, an addend).
template <int kThreads, int kPer, typename Routed, typename Extra>
__device__ __forceinline__ void moe_combine_add_rmsnorm_row(Routed routed, int64_t top_k, Extra extra, int64_t hidden,
                                                            float* __restrict__ residual,
                                                            const uint16_t* __restrict__ weight, float eps,
                                                            uint16_t* __restrict__ normed) {
  if constexpr (kPer > 0) {
    rmsnorm_row_regs<kThreads, kPer, true>(
        [&](float (&v)[kPer]) {
          // The slot loop outside the element loop, kSlots slots at a time: all their loads are issued before the
          // first add waits on one (a one-block row is a chain of memory round trips otherwise, one per slot); the
          // adds stay in slot order, so the bits do not depend on kSlots.
          constexpr int kSlots = kPer <= 8 ? 4 : kPer <= 16 ? 2 : 1;
          int64_t k = 0;
          for (; k + kSlots <= top_k; k += kSlots) {
            float y[kSlots][kPer];
#pragma unroll
            for (int s = 0; s < kSlots; ++s)
#pragma unroll
              for (int j = 0; j < kPer; ++j) {
                const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
                y[s][j] = i < hidden ? routed(k + s, i) : 0.f;
              }
#pragma unroll
            for (int s = 0; s < kSlots; ++s)
#pragma unroll
              for (int j = 0; j < kPer; ++j)
                if (threadIdx.x + static_cast<int64_t>(j) * kThreads < hidden) v[j] += y[s][j];
          }
          for (; k < top_k; ++k) {
#pragma unroll
            for (int j = 0; j < kPer; ++j) {
              const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
              if (i < hidden) v[j] += routed(k, i);
            }
          }
#pragma unroll
          for (int j = 0; j < kPer; ++j) {
            const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
            if (i < hidden) v[j] = bf16_bits_to_float(float_to_bf16_bits(extra(v[j], i)));
          }
        },
        residual, weight, hidden, eps, normed);
  } else {
    rmsnorm_row<kThreads, true>(
        [&](int64_t i) {
          float s = 0.f;
          for (int64_t k = 0; k < top_k; ++k) s += routed(k, i);
          return bf16_bits_to_float(float_to_bf16_bits(extra(s, i)));
        },
        residual, weight, hidden, eps, normed);
  }
}

}  // namespace kiln::cuda

// The scale of an RMSNorm / LayerNorm row, computed as the CPU model computes it (kernels/cpu/norm.cpp): the sum of
// squares in fp64 (each fp32 square is exact there), then 1 / sqrt(mean + eps) in fp64, rounded to fp32 once. Why:
// rsqrtf over an fp32 sum is off from that by an ulp or two often enough that a bf16 output somewhere in a prompt
// rounds the other way, and every later row inherits it (the fixtures' bf16 CPU-vs-GPU logits then differed by
// ~5e-3 of max|logit| instead of ~1e-7). fp64 sums of the same exact squares in another order round to the same fp32
// scale except within ~1e-16 of a rounding boundary. IEEE fp64 division and sqrt are correctly rounded on the GPU
// (fast-math flags touch fp32 only).
#pragma once

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ double square_f64(float v) { return static_cast<double>(v) * static_cast<double>(v); }

__device__ __forceinline__ float inverse_rms(double sum_sq, int64_t dim, float eps) {
  return static_cast<float>(1.0 / sqrt(sum_sq / static_cast<double>(dim) + static_cast<double>(eps)));
}

}  // namespace kiln::cuda

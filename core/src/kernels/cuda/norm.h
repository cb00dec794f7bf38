// RMSNorm over [n, dim] rows on the GPU (semantics of kernels/cpu/norm.h; sums in fp32).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out = x · rsqrt(mean(x²) + eps) · weight. x, weight, out bf16.
Status rmsnorm_bf16(const uint16_t* x, const uint16_t* weight, int64_t n, int64_t dim, float eps, uint16_t* out,
                    StreamHandle stream);

// rmsnorm_bf16 of bf16(x) for fp32 rows x_stride floats apart: what rmsnorm_bf16 gives on a GEMM's output
// stored in bf16, when the GEMM stored fp32 instead (q_a shares its fp32 GEMM output with kv_a).
Status rmsnorm_rounded_f32_bf16(const float* x, int64_t x_stride, const uint16_t* weight, int64_t n, int64_t dim,
                                float eps, uint16_t* out, StreamHandle stream);

// The pre-norm residual step: residual += x (fp32 residual stream, written back), out = rmsnorm(residual) in bf16.
Status add_rmsnorm_bf16(const uint16_t* x, float* residual, const uint16_t* weight, int64_t n, int64_t dim, float eps,
                        uint16_t* out, StreamHandle stream);

}  // namespace kiln::cuda

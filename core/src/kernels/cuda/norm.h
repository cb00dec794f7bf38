// RMSNorm over [n, dim] rows on the GPU (semantics of kernels/cpu/norm.h; sums in fp32).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// out = x · rsqrt(mean(x²) + eps) · weight. x, weight, out bf16.
Status rmsnorm_bf16(const uint16_t* x, const uint16_t* weight, int64_t n, int64_t dim, float eps, uint16_t* out,
                    StreamHandle stream);

// The pre-norm residual step: residual += x (fp32 residual stream, written back), out = rmsnorm(residual) in bf16.
Status add_rmsnorm_bf16(const uint16_t* x, float* residual, const uint16_t* weight, int64_t n, int64_t dim, float eps,
                        uint16_t* out, StreamHandle stream);

}  // namespace kiln::cuda

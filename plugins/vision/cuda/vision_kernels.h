// The vision tower's element-wise and row-wise steps on the GPU, in fp32 as the CPU reference (vision_ops.h) computes
// them; the matrix products go through cuBLAS (vision_tower_cuda.cpp). Raw device pointers, all on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::vision::cuda {

// y[r, c] += b[c]
void add_bias(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream);
// x[i] += y[i]
void add_into(float* x, const float* y, int64_t count, cudaStream_t stream);
// y = x · rsqrt(mean(x²) + eps) · w per row (y may be x).
void rms_norm_rows(const float* x, float* y, const float* w, int64_t rows, int64_t width, float eps,
                   cudaStream_t stream);
// On qkv [n, 3, heads, head_dim]: q and k of every head RMS-normed (q_norm / k_norm) then rotated with the
// per-row tables cos / sin [n, head_dim] (rotate-half).
void qk_norm_rope(float* qkv, const float* q_norm, const float* k_norm, const float* cos_t, const float* sin_t,
                  int64_t n, int64_t heads, int64_t head_dim, float eps, cudaStream_t stream);
// In place per row: softmax.
void softmax_rows(float* s, int64_t rows, int64_t cols, cudaStream_t stream);
// gate ← silu(min(gate, limit)) · clamp(up, −limit, limit)
void clamped_swiglu(float* gate, const float* up, int64_t count, float limit, cudaStream_t stream);
// In place per row: (x − mean) · rsqrt(var + eps) · w + b (biased variance).
void layer_norm_rows(float* x, const float* w, const float* b, int64_t rows, int64_t width, float eps,
                     cudaStream_t stream);
// In place: exact (erf) GELU.
void gelu(float* x, int64_t count, cudaStream_t stream);

}  // namespace kiln::vision::cuda

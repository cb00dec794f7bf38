// Normalisations over the last dimension of [n, dim] fp32 rows. Sums are accumulated in fp64.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// out = x · rsqrt(mean(x²) + eps) · weight (Hugging Face *RMSNorm: normalise in fp32, then scale).
void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out);

// The pre-norm residual step fused: residual += x (written back), then out = rmsnorm(residual).
void add_rmsnorm(const float* x, float* residual, const float* weight, int64_t n, int64_t dim, float eps, float* out);

// out = (x − mean) · rsqrt(var + eps) · weight + bias, biased variance (torch.nn.LayerNorm).
// The DSA indexer's k_norm uses eps 1e-6.
void layernorm(const float* x, const float* weight, const float* bias, int64_t n, int64_t dim, float eps, float* out);

}  // namespace kiln::cpu

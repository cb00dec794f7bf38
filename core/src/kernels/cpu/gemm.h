// Reference matrix multiply for linear layers: y[n, out] = x[n, in] · Wᵀ with W row-major [out, in]
// (the Hugging Face nn.Linear layout). x and y are fp32 and contiguous; y is overwritten.
// Accumulation is fp32; 16-bit weights are widened exactly on the fly.
#pragma once

#include <cstdint>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

void gemm_f32(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y);
void gemm_bf16(const float* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, float* y);
void gemm_f16(const float* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, float* y);

// Dispatches on the weight dtype: kF32, kBF16 or kF16; anything else is invalid_argument.
Status gemm(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out, float* y);

}  // namespace kiln::cpu

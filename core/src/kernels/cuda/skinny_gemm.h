// y[n, out] = x[n, in] · Wᵀ for few rows (decode: n ≤ 64) at the weight-streaming rate: W is read once with
// 16-byte loads and applied to all n rows on the tensor cores (mma.sync m16n8k16, W rows as M, tokens as N,
// fp32 accumulation). CublasGemm::linear dispatches here for n ≤ kSkinnyGemmMaxRows.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// Largest n the kernel takes.
inline constexpr int64_t kSkinnyGemmLimit = 64;
// Largest n linear() sends here. Above it cuBLAS's tiled GEMM wins: at n = 64 each 16-byte weight load feeds 16
// mma.sync per warp, which is about the SM's mma.sync issue rate at 4.26 TB/s, and the x operand (re-read from L2
// by every block) grows to the weight's own size.
inline constexpr int64_t kSkinnyGemmMaxRows = 32;

// True when the kernel can run these operands: 1 ≤ n ≤ kSkinnyGemmLimit, in % 8 == 0, x and w 16-byte aligned.
bool skinny_gemm_supported(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w);

// Semantics of CublasGemm::linear: x bf16 [n, in], W bf16 [out, in], y bf16 or fp32 [n, out] (y_dtype kBF16 /
// kF32), y = x·Wᵀ (+ y when accumulate, summed in fp32 before rounding). sm_count sizes the grid.
Status skinny_gemm_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, void* y,
                        DType y_dtype, bool accumulate, int sm_count, StreamHandle stream);

}  // namespace kiln::cuda

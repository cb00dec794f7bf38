// y[n, out] = x[n, in] · Wᵀ for few rows (decode: n ≤ 64) at the weight-streaming rate: W is read once with
// 16-byte loads and applied to all n rows on the tensor cores (mma.sync m16n8k16, W rows as M, tokens as N,
// fp32 accumulation). CublasGemm::linear dispatches here where skinny_gemm_preferred(n, out).
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// Largest n the kernel takes.
inline constexpr int64_t kSkinnyGemmLimit = 64;
// Batch invariance: every output's summation order depends on `in` only (skinny_gemm.cu, kKSlices), so a row's
// results are bitwise the same whatever other rows share the call (the CUDA runner relies on it to make speculative
// verification lossless) and whatever other rows of W do (a tensor-parallel rank's column-sharded part gives the
// whole product's bits). That holds up to kSkinnyGemmLimit rows; linear() sends rows here up to kSkinnyGemmMaxRows.
//
// Where linear() sends few rows here rather than to cuBLAS (measured on the H200 at GLM-4.7-Flash's shapes, see
// bench/kernel_bench.cpp): the per-layer projections (out ≤ 16384) are faster here up to n = 32 and slower at 64,
// where each 16-byte weight load feeds 16 mma.sync per warp and every block re-reads x from L2. The lm_head
// (out = 154880) is level with cuBLAS up to n = 4 and slower from n = 16, as its x re-reads then rival W itself —
// but it stays here up to kSkinnyGemmMaxRows as well (kSkinnyGemmMaxRowsWideOut, until 2026-12-03 8): a verification
// pass of K drafts has 1 + K logit rows a sequence, and only this kernel keeps a row's logits independent of how many
// rows share the call, so drafted greedy output equals undrafted output up to 32 logit rows a step, not 8.
inline constexpr int64_t kSkinnyGemmMaxRows = 32;
inline constexpr int64_t kSkinnyGemmMaxRowsWideOut = kSkinnyGemmMaxRows;
inline constexpr int64_t kSkinnyGemmWideOut = 16384;
inline bool skinny_gemm_preferred(int64_t n, int64_t out) {
  return n <= (out <= kSkinnyGemmWideOut ? kSkinnyGemmMaxRows : kSkinnyGemmMaxRowsWideOut);
}

// True when the kernel can run these operands: 1 ≤ n ≤ kSkinnyGemmLimit, in % 8 == 0, x and w 16-byte aligned.
bool skinny_gemm_supported(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w);

// A strided batch of GEMMs sharing n, in and out (strides in elements): batch b computes
// y_b[n, out] = x_b[n, in] · W_bᵀ with x_b = x + b·x_batch (rows x_row apart), W_b = w + b·w_batch ([out, in],
// rows `in` apart) and y_b = y + b·y_batch (rows y_row apart). x_row, x_batch and w_batch must be multiples
// of 8 (16-byte loads); batches ≤ 65535.
struct SkinnyStrides {
  int64_t batches = 1;
  int64_t x_row = 0, x_batch = 0, w_batch = 0, y_row = 0, y_batch = 0;
};

// Semantics of CublasGemm::linear: x bf16 [n, in], W bf16 [out, in], y bf16 or fp32 [n, out] (y_dtype kBF16 /
// kF32), y = x·Wᵀ (+ y when accumulate, summed in fp32 before rounding). sm_count sizes the grid.
Status skinny_gemm_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out, void* y,
                        DType y_dtype, bool accumulate, int sm_count, StreamHandle stream);

// skinny_gemm_bf16 over a strided batch (e.g. MLA's per-head absorption products: batches = heads).
Status skinny_gemm_strided_batched_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t out,
                                        void* y, DType y_dtype, const SkinnyStrides& strides, bool accumulate,
                                        int sm_count, StreamHandle stream);

// A fused gate_up projection with SwiGLU in its epilogue (decode's shared expert and dense MLP):
// act[n, inter] = bf16(silu(min(g, limit)) · clamp(u, −limit, limit)) where g | u = bf16(x · Wᵀ) and W bf16
// [2·inter, in] holds the gate rows, then the up rows — what linear() into a bf16 [n, 2·inter] buffer followed by
// swiglu_bf16 computes, in one kernel. 1 ≤ n ≤ kSkinnyGemmMaxRows (batch invariant), in % 8 == 0, x and W
// 16-byte aligned.
Status skinny_gemm_swiglu_bf16(const uint16_t* x, int64_t n, int64_t in, const uint16_t* w, int64_t inter,
                               uint16_t* act, StreamHandle stream,
                               float limit = std::numeric_limits<float>::infinity());

}  // namespace kiln::cuda

// One GEMM per attention head, all heads in one cuBLASLt launch, each head's values independent of how many heads
// share the launch. MLA prefill's kv_b expansion uses it: a tensor-parallel rank expands only its own heads and must
// get the one-rank bits, and one cuBLAS GEMM as wide as all heads lets cuBLAS pick its kernel (tile, split-K, so the
// summation order) by that width. Here the algorithm is chosen once per head problem — (m, n, k, leading dimensions),
// the same on every rank — for a fixed probe batch, and that algorithm runs over any number of heads; a batched
// kernel computes every batch entry the same way. (The per-head cuBLAS calls it replaces were, for a 4K prompt of
// GLM-4.7-Flash, 20 launches of ≈ 5.6 µs a layer, each with a launch gap.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// The device workspace a call needs (the algorithm's tile scheduling over the batch: on an H100 the heuristic's
// workspace-free pick for two heads asked for one at 20).
inline constexpr size_t kHeadBatchedGemmWorkspaceBytes = size_t{32} << 20;

// For h < heads, row-major bf16: y_h [n][m] = x [n][k] · w_hᵀ, w_h [m][k] = w + h·m·k, x rows x_ld apart (shared
// by every head), y_h = y + h·y_head_stride (0: n·m, the heads packed; larger: each head's rows inside a wider
// block, as chunk after chunk of a prompt's keys fill one workspace). fp32 accumulation, bf16 output; `workspace` holds kHeadBatchedGemmWorkspaceBytes
// (stream-ordered: not used by another stream meanwhile). kUnimplemented (nothing written) where cuBLASLt has no
// algorithm for the problem within that workspace; the caller may then run one GEMM per head.
Status head_batched_gemm_bf16(const uint16_t* x, int64_t n, int64_t k, int64_t x_ld, const uint16_t* w, int64_t m,
                              int64_t heads, uint16_t* y, void* workspace, StreamHandle stream,
                              int64_t y_head_stride = 0);

}  // namespace kiln::cuda

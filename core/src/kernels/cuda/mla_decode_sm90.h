// The absorbed-MLA decode attention on Hopper's asynchronous units, for the built-in bf16 layout: one thread streams
// each 64-key tile of the paged cache into shared memory with bulk tensor copies (TMA, one box per 64 columns and
// page), and two consumer warpgroups take alternate tiles through warpgroup tensor-core products (wgmma) — the
// scores with the keys as the 64 rows and up to 32 (row, head) pairs as the columns, the values as 64-dim blocks of
// Vᵀ times Pᵀ — each with its own online softmax, merged once at the end. Same parameters, grid, splits, workspace
// and merge as the SDK's mma.sync kernel (kiln/cuda/mla_decode_tc.cuh), so the plan and the batch invariance are
// unchanged; its sums run in another order, so its bits differ from that kernel's (both are within the tolerance
// of the CPU reference: tests/gpu/mla_decode_test.cpp).
#pragma once

#include "kernels/cuda/stream_handle.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Whether mla_decode_sm90 takes these parameters on the current device: an sm_90 GPU, dense attention (no DSA
// selection), rows of 512 + 64 or 512 + 0, pages of a multiple of 64 tokens or of 8, 16 or 32, a 16-byte aligned
// cache.
bool mla_decode_sm90_takes(const MlaDecodeParams& p);

// Queues the attention (and the merge of its splits) on `stream`; mla_decode_check(p) and mla_decode_sm90_takes(p)
// must hold.
Status mla_decode_sm90(const MlaDecodeParams& p, StreamHandle stream);

}  // namespace kiln::cuda

// The Hopper form of the MLA prefill kernel (mla_prefill.h's contract), FlashAttention-3 style: warpgroup MMA
// (wgmma, sm_90a) over 128-byte-swizzled shared-memory tiles. Per CTA one head's 128 query rows: a producer warpgroup
// streams 64-key K / V tiles through two-deep rings with TMA (bulk tensor copies completing on mbarriers), and two
// consumer warpgroups of 64 rows each compute S = Q·Kᵀ from shared memory and O += P·V with P from registers, the
// value product of tile t − 1 running on the tensor cores while the softmax of tile t runs on the CUDA cores.
#pragma once

#include "kernels/cuda/mla_prefill.h"

namespace kiln::cuda {

// Whether (nope, rope, v) has a Hopper kernel and the current device runs sm_90a code (compute capability 9.0).
bool mla_prefill_sm90_applies(int64_t nope_dim, int64_t rope_dim, int64_t v_dim);

// Precondition: mla_prefill_sm90_applies, pointers / strides 16-byte aligned as mla_prefill.cu checks, and
// params.total_keys > 0 (the TMA maps' key extent).
Status mla_prefill_sm90(const MlaPrefillParams& params, StreamHandle stream);

}  // namespace kiln::cuda

// The Hopper form of the MLA prefill kernel (mla_prefill.h's contract): warpgroup MMA (wgmma, sm_90a) over
// 128-byte-swizzled shared-memory tiles. Two warpgroups of 64 query rows each share one head's 128-row query tile;
// 64-key K / V tiles stream through a two-deep cp.async ring, and the value product of tile t − 1 (P from registers)
// runs on the tensor cores while the softmax of tile t runs on the CUDA cores.
#pragma once

#include "kernels/cuda/mla_prefill.h"

namespace kiln::cuda {

// Whether (nope, rope, v) has a Hopper kernel and the current device runs sm_90a code (compute capability 9.0).
bool mla_prefill_sm90_applies(int64_t nope_dim, int64_t rope_dim, int64_t v_dim);

// Precondition: mla_prefill_sm90_applies, and pointers / strides 16-byte aligned as mla_prefill.cu checks.
Status mla_prefill_sm90(const MlaPrefillParams& params, StreamHandle stream);

}  // namespace kiln::cuda

// Absorbed MLA decode attention over the paged bf16 latent cache (the GPU form of KvLayout::attend for the
// built-in bf16 layout; math of cpu::mla_attention_absorbed_bf16). The kernel is the SDK's tensor-core MLA decode
// (kiln/cuda/mla_decode_tc.cuh; parameters, grid and workspace planning in kiln/cuda/mla_decode_plan.h) over bf16
// pages [block_size, 512 + rope_dim]: rows copied straight into its tiles — or, chosen with KILN_MLA_DECODE=sm90 on
// an sm_90 GPU for the shapes it takes, the Hopper kernel (kernels/cuda/mla_decode_sm90.h: TMA + wgmma), the same
// plan and contract.
#pragma once

#include "kernels/cuda/stream_handle.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Which kernel runs: `automatic` is the mma.sync kernel unless the environment sets KILN_MLA_DECODE=sm90 (the A/B
// switch) and mla_decode_sm90_takes(params); the tests name one.
enum class MlaDecodeKernel { automatic, mma_sync, sm90 };

Status mla_decode_bf16(const MlaDecodeParams& params, StreamHandle stream,
                       MlaDecodeKernel kernel = MlaDecodeKernel::automatic);

}  // namespace kiln::cuda

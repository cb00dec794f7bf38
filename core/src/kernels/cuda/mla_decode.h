// Absorbed MLA decode attention over the paged bf16 latent cache (the GPU form of KvLayout::attend for the
// built-in bf16 layout; math of cpu::mla_attention_absorbed_bf16). The kernel is the SDK's tensor-core MLA decode
// (kiln/cuda/mla_decode_tc.cuh; parameters, grid and workspace planning in kiln/cuda/mla_decode_plan.h) over bf16
// pages [block_size, 512 + rope_dim]: rows copied straight into its tiles.
#pragma once

#include "kernels/cuda/stream_handle.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/status.h"

namespace kiln::cuda {

Status mla_decode_bf16(const MlaDecodeParams& params, StreamHandle stream);

}  // namespace kiln::cuda

// The GLM / DeepSeek-V3 MoE gate on the GPU (semantics of cpu::moe_route, incl. ties by lower id).
#pragma once

#include <cstdint>

#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// logits fp32 [n, E] (x · gate.weightᵀ), bias fp32 [E] or null; ids int32 / weights fp32 [n, top_k].
// E ≤ 1024, top_k ≤ 32, n_group ≤ 32. One warp per token.
Status moe_route(const float* logits, const float* bias, int64_t n, const cpu::MoeRouterConfig& config, int32_t* ids,
                 float* weights, StreamHandle stream);

}  // namespace kiln::cuda

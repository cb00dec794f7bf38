// The MoE gate and the grouping by expert in one launch for decode batches: what moe_route followed by
// moe_group_by_expert computes (same ids, weights and dispatch lists, bit for bit).
#pragma once

#include <cstdint>

#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Up to this many tokens one block routes and groups (one launch); more run moe_route's many-block grid and
// then moe_group_by_expert (two launches). Measured on the H200 (E = 64, top-4, CUDA-event median of one call):
// fused 12.6 / 13.6 / 15.8 / 29.6 µs vs two launches 13.9 / 14.4 / 16.7 / 24.2 µs at 1 / 4 / 16 / 64 tokens.
inline constexpr int64_t kFusedRouteMaxTokens = 16;

// logits fp32 [n, E], bias fp32 [E] or null; ids int32 / weights fp32 [n, top_k]; dispatch as
// moe_group_by_expert over the n·top_k pairs. Shapes as moe_route (E ≤ 1024, top_k ≤ 32, n_group ≤ 32).
Status moe_route_and_group(const float* logits, const float* bias, int64_t n, const cpu::MoeRouterConfig& config,
                           int32_t* ids, float* weights, const MoeDispatch& dispatch, StreamHandle stream);

}  // namespace kiln::cuda

// The MoE gate GEMV, the router and the grouping by expert in one launch for decode batches: what
// moe_gate_logits_bf16 followed by moe_route_and_group computes (the same logits, ids, weights and dispatch
// lists, bit for bit).
#pragma once

#include <cstdint>

#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// True when moe_gate_route_and_group takes these operands: 1 ≤ n ≤ kFusedRouteMaxTokens, hidden % 4 == 0,
// x 8-byte and w 16-byte aligned, a router shape moe_route takes.
bool moe_gate_route_and_group_supported(const uint16_t* x, int64_t n, int64_t hidden, const float* w,
                                        const cpu::MoeRouterConfig& config);

// x bf16 [n, hidden], w fp32 [E, hidden] (the router), logits fp32 [n, E] (written, as moe_gate_logits_bf16),
// bias fp32 [E] or null; ids, weights and dispatch as moe_route_and_group. The gate's blocks each take 8
// experts; the last block to finish routes and groups. `done` is a device counter, zero before the first call,
// which the kernel leaves at zero: one per stream (concurrent calls must not share it).
Status moe_gate_route_and_group(const uint16_t* x, int64_t n, int64_t hidden, const float* w, float* logits,
                                const float* bias, const cpu::MoeRouterConfig& config, int32_t* ids, float* weights,
                                const MoeDispatch& dispatch, unsigned* done, StreamHandle stream);

}  // namespace kiln::cuda

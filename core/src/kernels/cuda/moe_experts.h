// Routed experts for decode on the GPU: the (token, slot) pairs grouped by expert, then one pass over each
// active expert's weights per step (batched GEMV: every weight byte is read once and applied to all of that
// expert's tokens), then the weighted sum per token.
//
// Weights are bf16, row-major, stacked over experts: gate_up [E, 2·inter, hidden] (gate rows first, as HF's
// fused gate_up_proj), down [E, hidden, inter]. A dense SwiGLU MLP (the shared expert) is the case E = 1 with
// every id 0 and top_k = 1. Pair p = t·top_k + j is token t's j-th routed expert.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

struct MoeDispatch {
  int32_t* expert_offsets = nullptr;  // [E + 1]: pairs of expert e are pair_order[offsets[e] .. offsets[e+1])
  int32_t* active_experts = nullptr;  // [E]: experts with at least one pair, ascending; −1 after the last
  int32_t* pair_order = nullptr;      // [pairs]: pairs grouped by expert, in pair order within an expert
};

// ids [pairs] int32 (the router's [n, top_k]); E ≤ 1024.
Status moe_group_by_expert(const int32_t* ids, int64_t pairs, int64_t num_experts, const MoeDispatch& dispatch,
                           StreamHandle stream);

// h[p, i] = silu(gate_e · x_t)·(up_e · x_t) for every pair p (e = ids[p], t = p / top_k), bf16 [pairs, inter].
// x bf16 [n, hidden]; hidden % 8 == 0. `limit` clamps as cpu::swiglu (inf: none).
Status moe_gate_up_swiglu_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                               const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& dispatch, float limit,
                               uint16_t* h, StreamHandle stream);

// y[p, :] = route_weight[p] · (down_e · h[p]), fp32 [pairs, hidden]; inter % 8 == 0; route_weight may be null (1).
Status moe_down_bf16(const uint16_t* h, int64_t pairs, int64_t inter, int64_t hidden, const uint16_t* down,
                     int64_t num_experts, const MoeDispatch& dispatch, const float* route_weight, float* y,
                     StreamHandle stream);

// out[t, :] = bf16(Σ_j y[t·top_k + j, :] + add[t, :]), in slot order; add (e.g. the shared expert) may be null.
Status moe_combine_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add, uint16_t* out,
                        StreamHandle stream);

}  // namespace kiln::cuda

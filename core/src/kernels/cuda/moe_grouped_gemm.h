// Routed experts for prefill on tensor cores: a grouped GEMM per projection over the (token, slot) pairs grouped
// by expert (the MoeDispatch of moe_group_by_expert). For many tokens per expert the GEMV path of moe_experts.h
// is compute-bound on CUDA cores; here each expert's pairs form the M dimension of one GEMM against its weights.
//
// The token permutation is fused into the first GEMM's operand load (row i of expert e's tile is x[pair / top_k]
// for pair = pair_order[offsets[e] + i]), and its output h stays in grouped order, so no [pairs, hidden] copy of
// x is made. Tiles are found on the device from expert_offsets: no host sync, safe inside a CUDA graph.
//
// On compute capability 9.0 both run the Hopper form (moe_grouped_gemm_sm90.h: wgmma, TMA); elsewhere, or with
// KILN_MOE_GROUPED_SM90=0, the mma.sync form of moe_grouped_gemm.cu. Both are deterministic and give each row a
// result independent of the other rows; the two forms differ from each other by fp32 summation order only.
//
// Weights and layouts as moe_experts.h: gate_up [E, 2·inter, hidden] (gate rows first), down [E, hidden, inter],
// bf16 row-major; fp32 accumulation.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// h_grouped[s, i] = silu(gate_e · x_t)·(up_e · x_t) for the pair p = pair_order[s] (e its expert, t = p / top_k),
// bf16 [n·top_k, inter] in grouped order. x bf16 [n, hidden]; hidden % 8 == 0, inter % 8 == 0; x, gate_up
// 16-byte aligned. `limit` clamps as cpu::swiglu (inf: none).
Status moe_gate_up_swiglu_grouped_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                                       const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& dispatch,
                                       float limit, uint16_t* h_grouped, StreamHandle stream);

// y[p, :] = route_weight[p] · (down_e · h_grouped[s]) for p = pair_order[s], fp32 [pairs, hidden] in pair order
// (what moe_combine_bf16 takes); route_weight may be null (1). inter % 8 == 0, hidden % 8 == 0.
Status moe_down_grouped_bf16(const uint16_t* h_grouped, int64_t pairs, int64_t inter, int64_t hidden,
                             const uint16_t* down, int64_t num_experts, const MoeDispatch& dispatch,
                             const float* route_weight, float* y, StreamHandle stream);

// Whether a step's routed experts should take this path rather than the GEMV one: from ~4 pairs per expert on
// average. Measured on the H200 at GLM-4.7-Flash shapes (E 64, top-4): 32 tokens GEMV 334 µs vs grouped 434 µs,
// 128 tokens 983 vs 482 µs (crossover ≈ 48 tokens ≈ 3 pairs per expert; bench/NOTES-cuda.md).
inline bool moe_prefers_grouped_gemm(int64_t pairs, int64_t num_experts) { return pairs >= 4 * num_experts; }

}  // namespace kiln::cuda

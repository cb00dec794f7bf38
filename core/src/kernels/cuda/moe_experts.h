// Routed experts for decode on the GPU: the (token, slot) pairs grouped by expert, then one pass over each
// active expert's weights per step (batched GEMV: every weight byte is read once and applied to all of that
// expert's tokens), then the weighted sum per token.
//
// Weights are bf16, row-major, stacked over experts: gate_up [E, 2·inter, hidden] (gate rows first, as HF's
// fused gate_up_proj), down [E, hidden, inter]. A dense SwiGLU MLP (the shared expert) is the case E = 1 with
// every id 0 and top_k = 1. Pair p = t·top_k + j is token t's j-th routed expert.
//
// Every kernel here is launched with launch_pdl (pdl.cuh).
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

// A shared expert of the routed experts' shape run inside the routed-expert launches: one more always-active
// expert whose rows are the step's n tokens, weight 1, its tiles in the same grid as the routed experts' (two
// launches a layer fewer than running it as a dense MLP). Its weights are its own tensors, read in place; its
// rows are outside the routed pairs' indexing and have their own outputs. A row's results depend on that row
// alone, as the routed pairs' do.
struct MoeSharedExpert {
  const uint16_t* gate_up = nullptr;  // [2·inter, hidden], gate rows first; 16-byte aligned
  const uint16_t* down = nullptr;     // [hidden, inter]; 16-byte aligned
  int64_t n = 0;                      // its rows: the step's tokens
  uint16_t* h = nullptr;              // [n, inter] bf16: its SwiGLU output (gate_up writes it, down reads it)
  float* y = nullptr;                 // [n, hidden] fp32: its output, what moe_combine takes as shared_y
};

// ids [pairs] int32 (the router's [n, top_k]); E ≤ 1024.
Status moe_group_by_expert(const int32_t* ids, int64_t pairs, int64_t num_experts, const MoeDispatch& dispatch,
                           StreamHandle stream);

// h[p, i] = silu(gate_e · x_t)·(up_e · x_t) for every pair p (e = ids[p], t = p / top_k), bf16 [pairs, inter].
// x bf16 [n, hidden]; hidden % 8 == 0. `limit` clamps as cpu::swiglu (inf: none). With `shared` (gate_up and h
// set, shared->n == n), also shared->h[t] = silu(gate_s · x_t)·(up_s · x_t) in the same launch.
Status moe_gate_up_swiglu_bf16(const uint16_t* x, int64_t n, int64_t top_k, int64_t hidden, int64_t inter,
                               const uint16_t* gate_up, int64_t num_experts, const MoeDispatch& dispatch, float limit,
                               uint16_t* h, StreamHandle stream, const MoeSharedExpert* shared = nullptr);

// y[p, :] = route_weight[p] · (down_e · h[p]), fp32 [pairs, hidden]; inter % 8 == 0; route_weight may be null (1).
// With `shared` (down, h and y set), also shared->y[t] = down_s · shared->h[t] for its n rows in the same launch.
Status moe_down_bf16(const uint16_t* h, int64_t pairs, int64_t inter, int64_t hidden, const uint16_t* down,
                     int64_t num_experts, const MoeDispatch& dispatch, const float* route_weight, float* y,
                     StreamHandle stream, const MoeSharedExpert* shared = nullptr);

// out[t, :] = bf16(Σ_j y[t·top_k + j, :] + bf16(shared_y[t, :]) + add[t, :]), summed in slot order, then shared_y
// (fp32 [n, hidden]: a folded shared expert's rows, rounded to bf16 first as a shared expert run apart stores its
// output), then add (bf16 [n, hidden]: a shared expert run apart); both may be null.
Status moe_combine_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add, uint16_t* out,
                        StreamHandle stream, const float* shared_y = nullptr);

// moe_combine_bf16 followed by the next block's pre-norm residual step, in one launch, bit for bit what
//   moe_combine_bf16(y, n, top_k, hidden, add, out, stream, shared_y);
//   add_rmsnorm_bf16(out, residual, norm_weight, n, hidden, eps, normed, stream);
// computes (residual fp32 [n, hidden] += the combined bf16 rows, normed bf16 [n, hidden] = rmsnorm(residual) ·
// norm_weight), without writing the combined rows anywhere.
Status moe_combine_add_rmsnorm_bf16(const float* y, int64_t n, int64_t top_k, int64_t hidden, const uint16_t* add,
                                    const float* shared_y, float* residual, const uint16_t* norm_weight, float eps,
                                    uint16_t* normed, StreamHandle stream);

}  // namespace kiln::cuda

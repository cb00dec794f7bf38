// The CUDA runner's routed-expert arithmetic on the host, for the CPU models' bf16 precision (model.precision =
// "bf16"): per (token, slot) pair, gate and up in fp32, the (clamped) SwiGLU output stored in bf16, down in fp32
// scaled by the pair's route weight; a token's pairs summed in slot order (what moe_combine_bf16 sums). Shared by
// every architecture whose CPU path models the GPU's rounding.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "kiln/status.h"
#include "model/model_weights.h"

namespace kiln {

// Up to this many rows in a step the dense CUDA expert set (builtin/cuda/dense_cuda_weights.cpp) folds a dense
// shared expert of the routed experts' shape into their launches: its gate / up in fp32 and only its SwiGLU output
// rounded, like a routed expert's, where run apart (dense_mlp) its gate_up is stored in bf16 first. The combine
// rounds the folded output to bf16 as dense_mlp stores it. = cuda::kSkinnyGemmMaxRows (static_assert there). A
// quantized format's expert set (EXL3) folds nothing.
inline constexpr int64_t kGpuFoldedSharedExpertRows = 32;
// Whether a step of `rows` rows runs the shared expert `shared` folded, given one of the routed experts (`routed`,
// null if this rank holds none) and their intermediate size: the CPU models' bf16 precision follows the GPU.
inline bool gpu_folds_shared_expert(int64_t rows, const MlpWeights& shared, const MlpWeights* routed,
                                    int64_t routed_inter) {
  auto dense = [](const std::unique_ptr<Linear>& l) { return l && l->dense_weight().data != nullptr; };
  return rows <= kGpuFoldedSharedExpertRows && routed && dense(routed->gate) && dense(routed->up) &&
         dense(routed->down) && dense(shared.gate) && dense(shared.up) && dense(shared.down) &&
         shared.down->in_features() == routed_inter;
}

// One expert-shaped SwiGLU MLP as the expert kernels compute it (only the SwiGLU output rounded): y [rows, hidden].
Status expert_mlp_bf16(const MlpWeights& w, const float* x, int64_t rows, float* y,
                       float swiglu_limit = std::numeric_limits<float>::infinity());

// pair_out [n · top_k, hidden] (zeroed by the caller): route_weights[p] · expert_{ids[p]}(h[p / top_k]) for the
// pairs p whose expert is one of `experts`, which hold experts [expert_begin, expert_begin + size) (a tensor-parallel
// rank's); other pairs are left as they are.
Status routed_expert_pairs_bf16(std::span<const MlpWeights> experts, int64_t expert_begin, int64_t num_experts,
                                const float* h, int64_t n, int64_t hidden, int64_t top_k, const int32_t* ids,
                                const float* route_weights, float* pair_out,
                                float swiglu_limit = std::numeric_limits<float>::infinity());

// out [n, hidden] = Σ_j route_weights[t, j] · expert_{ids[t, j]}(h[t]) over the top_k slots in order.
Status routed_experts_bf16(std::span<const MlpWeights> experts, const float* h, int64_t n, int64_t hidden,
                           int64_t top_k, const int32_t* ids, const float* route_weights, float* out,
                           float swiglu_limit = std::numeric_limits<float>::infinity());

}  // namespace kiln

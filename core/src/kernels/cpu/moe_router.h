// The GLM / DeepSeek-V3 MoE gate after its fp32 logits (x · gate.weightᵀ).
#pragma once

#include <cstdint>

namespace kiln::cpu {

struct MoeRouterConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;           // num_experts_per_tok
  int64_t n_group = 1;         // experts split into n_group equal groups (each ≥ 2 experts)
  int64_t topk_group = 1;      // groups kept; top_k ≤ topk_group · num_experts / n_group
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// For each of n tokens: p = sigmoid(logits); c = p + bias (bias = e_score_correction_bias, may be null);
// group score = sum of the two largest c in the group; keep the topk_group best groups; ids = top_k experts
// by c within them (descending c, ties by lower id; see topk.h); weights = p at ids, divided by
// (Σ + 1e-20) when norm_topk_prob, times routed_scaling_factor. logits [n, E], ids/weights [n, top_k].
// margin (may be null) [n]: lowered to each token's decision margin — the smallest gap between the last group /
// expert chosen and the first one left out — so a comparison at lower precision can tell a flipped near-tie
// from an error.
void moe_route(const float* logits, const float* bias, int64_t n, const MoeRouterConfig& config, int32_t* ids,
               float* weights, float* margin = nullptr);

}  // namespace kiln::cpu

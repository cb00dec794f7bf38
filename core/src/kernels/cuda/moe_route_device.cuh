// Device code shared by the router kernels (moe_router.cu, moe_route_group.cu): one warp routes one token with
// the semantics of cpu::moe_route (sigmoid, bias, group limit, top-k with ties by lower id, normalisation).
#pragma once

#include "kernels/cpu/moe_router.h"
#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda::moe_detail {

inline constexpr int kMaxRouterExperts = 1024;
inline constexpr int kNone = 1 << 30;  // no candidate: ranks after everything

struct RouterArgs {
  int experts, top_k, n_group, topk_group;
  bool norm_topk_prob;
  float scaling;
};

inline bool router_config_supported(const cpu::MoeRouterConfig& c) {
  return c.num_experts > 0 && c.num_experts <= kMaxRouterExperts && c.top_k > 0 && c.top_k <= 32 &&
         c.top_k <= c.num_experts && c.n_group > 0 && c.n_group <= 32 && c.num_experts % c.n_group == 0 &&
         c.topk_group > 0 && c.topk_group <= c.n_group;
}

inline RouterArgs router_args(const cpu::MoeRouterConfig& c) {
  return RouterArgs{static_cast<int>(c.num_experts), static_cast<int>(c.top_k), static_cast<int>(c.n_group),
                    static_cast<int>(c.topk_group), c.norm_topk_prob, c.routed_scaling_factor};
}

// a before b: larger value first, NaN last, then lower index (cpu::topk_indices' order).
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// The best (value, index) over the warp.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(~0u, v, off);
    const int oi = __shfl_xor_sync(~0u, i, off);
    if (oi != kNone && (i == kNone || ranks_before(ov, oi, v, i))) {
      v = ov;
      i = oi;
    }
  }
}

// The whole warp routes token t: prob / choice are this warp's [experts] scratch in shared memory; lanes
// < top_k write ids[t·top_k + lane] and weights[...].
__device__ __forceinline__ void route_token(const float* __restrict__ logits, const float* __restrict__ bias,
                                            int64_t t, const RouterArgs& a, float* prob, float* choice, int lane,
                                            int32_t* ids, float* weights) {
  for (int e = lane; e < a.experts; e += 32) {
    const float pr = 1.0f / (1.0f + expf(-logits[t * a.experts + e]));
    prob[e] = pr;
    choice[e] = pr + (bias ? bias[e] : 0.f);
  }
  __syncwarp();
  if (a.n_group > 1 && a.topk_group < a.n_group) {
    // Lane g scores group g (sum of its two best), then the topk_group best groups are kept.
    const int group_size = a.experts / a.n_group;
    float group_score = -INFINITY;
    if (lane < a.n_group) {
      float b1 = 0.f, b2 = 0.f;
      int i1 = -1, i2 = -1;
      for (int j = 0; j < group_size; ++j) {
        const int e = lane * group_size + j;
        const float v = choice[e];
        if (i1 < 0 || ranks_before(v, e, b1, i1)) {
          b2 = b1, i2 = i1, b1 = v, i1 = e;
        } else if (i2 < 0 || ranks_before(v, e, b2, i2)) {
          b2 = v, i2 = e;
        }
      }
      group_score = b1 + b2;
    }
    unsigned keep = 0;
    for (int k = 0; k < a.topk_group; ++k) {
      float v = (lane < a.n_group && !(keep >> lane & 1u)) ? group_score : -INFINITY;
      int i = lane < a.n_group && !(keep >> lane & 1u) ? lane : kNone;
      warp_best(v, i);
      keep |= 1u << i;
    }
    __syncwarp();
    for (int e = lane; e < a.experts; e += 32)
      if (!(keep >> (e / group_size) & 1u)) choice[e] = -INFINITY;
    __syncwarp();
  }
  // top_k rounds of a warp-wide best; lane bit j of `taken` marks expert lane + 32·j as already picked.
  float chosen_prob = 0.f;  // lane j keeps the j-th pick
  int chosen_id = 0;
  float sum = 0.f;
  uint32_t taken = 0;
  for (int k = 0; k < a.top_k; ++k) {
    float v = -INFINITY;
    int i = kNone;
    for (int j = 0, e = lane; e < a.experts; ++j, e += 32)
      if (!(taken >> j & 1u) && (i == kNone || ranks_before(choice[e], e, v, i))) {
        v = choice[e];
        i = e;
      }
    warp_best(v, i);
    if (i % 32 == lane) taken |= 1u << (i / 32);
    const float pr = prob[i];
    sum += pr;
    if (lane == k) {
      chosen_prob = pr;
      chosen_id = i;
    }
  }
  if (lane < a.top_k) {
    const float denominator = a.norm_topk_prob ? sum + 1e-20f : 1.0f;
    ids[t * a.top_k + lane] = chosen_id;
    weights[t * a.top_k + lane] = chosen_prob / denominator * a.scaling;
  }
  __syncwarp();  // prob / choice are reused by this warp's next token
}

}  // namespace kiln::cuda::moe_detail

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_router.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarpsPerBlock = 4;
constexpr int kNone = 1 << 30;  // no candidate: ranks after everything

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

struct RouterArgs {
  int experts, top_k, n_group, topk_group;
  bool norm_topk_prob;
  float scaling;
};

__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t n,
                                 RouterArgs a, int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float s_prob[kWarpsPerBlock][kMaxExperts];
  __shared__ float s_choice[kWarpsPerBlock][kMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= n) return;
  float* prob = s_prob[warp];
  float* choice = s_choice[warp];
  for (int e = lane; e < a.experts; e += 32) {
    const float pr = 1.0f / (1.0f + expf(-logits[t * a.experts + e]));
    prob[e] = pr;
    choice[e] = pr + (bias ? bias[e] : 0.f);
  }
  __syncwarp();
  if (a.n_group > 1 && a.topk_group < a.n_group) {
    // Lane g scores group g (sum of its two best), then lane 0 keeps the topk_group best groups.
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
}

}  // namespace

Status moe_route(const float* logits, const float* bias, int64_t n, const cpu::MoeRouterConfig& c, int32_t* ids,
                 float* weights, StreamHandle stream) {
  if (c.num_experts <= 0 || c.num_experts > kMaxExperts || c.top_k <= 0 || c.top_k > 32 || c.top_k > c.num_experts ||
      c.n_group <= 0 || c.n_group > 32 || c.num_experts % c.n_group != 0 || c.topk_group <= 0 ||
      c.topk_group > c.n_group)
    return invalid_argument("cuda::moe_route: unsupported router shape (E ≤ 1024, top_k ≤ 32, n_group ≤ 32 dividing E)");
  if (n <= 0) return ok_status();
  const RouterArgs a{static_cast<int>(c.num_experts), static_cast<int>(c.top_k), static_cast<int>(c.n_group),
                     static_cast<int>(c.topk_group), c.norm_topk_prob, c.routed_scaling_factor};
  moe_route_kernel<<<blocks_for(n, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(logits, bias, n, a, ids,
                                                                                        weights);
  return check_launch("cuda::moe_route");
}

}  // namespace kiln::cuda

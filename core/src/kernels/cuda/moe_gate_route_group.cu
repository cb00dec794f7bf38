#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_gate_device.cuh"
#include "kernels/cuda/moe_gate_route_group.h"
#include "kernels/cuda/moe_group_device.cuh"
#include "kernels/cuda/moe_route_device.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

constexpr int kGateGroups = kGroupThreads / kGateThreads;  // experts a block's gate pass takes at once
// Dynamic shared memory of the last block: the logits [n, E] (n ≤ kFusedRouteMaxTokens), then the routing warps'
// prob / choice rows.
constexpr size_t kSmemBudget = kRouteSmemBudget + kFusedRouteMaxTokens * kMaxRouterExperts * sizeof(float);

// Each group of kGateThreads threads computes the logits of experts blockIdx.x·kGateGroups + group, + gridDim.x ·
// kGateGroups, ... exactly as the gate GEMV's blocks do (its own named barrier). Then the last block to finish
// (a counter, reset by that block for the next launch) reads all logits back through L2, routes the tokens as
// moe_route_and_group's block does and groups the pairs.
__global__ void __launch_bounds__(kGroupThreads)
    gate_route_group_kernel(const uint16_t* __restrict__ x, int64_t n, int64_t hidden, const float* __restrict__ w,
                            float* logits, const float* __restrict__ bias, RouterArgs a, int warps_routing,
                            int32_t* ids, float* weights, MoeDispatch d, unsigned* done) {
  extern __shared__ float s_dyn[];  // last block: [n][experts] logits, then [warps_routing][2][experts]
  __shared__ float s_part[kGateGroups][kGateWarps][kGateTokens];
  __shared__ GroupSmem group_smem;
  const int group = threadIdx.x / kGateThreads, local = threadIdx.x % kGateThreads;
  // The router weights are read-only: start them toward L2 while the previous kernel finishes.
  for (int64_t e = int64_t(blockIdx.x) * kGateGroups + group; e < a.experts; e += int64_t(gridDim.x) * kGateGroups)
    prefetch_l2(w + e * hidden, sizeof(float) * hidden, local, kGateThreads);
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t e = int64_t(blockIdx.x) * kGateGroups + group; e < a.experts; e += int64_t(gridDim.x) * kGateGroups)
    gate_logits_for_expert(x, n, hidden, w, a.experts, e, local, s_part[group], 1 + group, logits);
  __threadfence();  // this block's logits reach L2 before its count
  __syncthreads();
  // Whether this block finished last, broadcast by the barrier itself (no shared flag for racecheck to flag: the
  // write and the reads of a flag across __syncthreads are ordered, but compute-sanitizer reported them as a hazard
  // next to the gate pass's named barriers).
  const int last = threadIdx.x == 0 && atomicAdd(done, 1u) == gridDim.x - 1;
  if (!__syncthreads_or(last)) return;
  if (threadIdx.x == 0) *done = 0;
  float* s_logits = s_dyn;
  for (int64_t i = threadIdx.x; i < n * a.experts; i += blockDim.x) s_logits[i] = __ldcg(logits + i);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < warps_routing) {
    float* prob = s_dyn + n * a.experts + static_cast<size_t>(warp) * 2 * a.experts;
    for (int64_t t = warp; t < n; t += warps_routing)
      route_token(s_logits, bias, t, a, prob, prob + a.experts, lane, ids, weights);
  }
  __syncthreads();  // ids written by this block are visible to all its threads
  group_pairs(ids, n * a.top_k, a.experts, d, group_smem);
}

}  // namespace

bool moe_gate_route_and_group_supported(const uint16_t* x, int64_t n, int64_t hidden, const float* w,
                                        const cpu::MoeRouterConfig& c) {
  return n >= 1 && n <= kFusedRouteMaxTokens && hidden > 0 && hidden % 4 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
         router_config_supported(c);
}

Status moe_gate_route_and_group(const uint16_t* x, int64_t n, int64_t hidden, const float* w, float* logits,
                                const float* bias, const cpu::MoeRouterConfig& c, int32_t* ids, float* weights,
                                const MoeDispatch& d, unsigned* done, StreamHandle stream) {
  if (!moe_gate_route_and_group_supported(x, n, hidden, w, c))
    return invalid_argument(
        "cuda::moe_gate_route_and_group: need 1 ≤ n ≤ 16, hidden % 4 == 0, x 8-byte and w 16-byte aligned, and a "
        "router shape moe_route takes (E ≤ 1024, top_k ≤ 32, n_group ≤ 32 dividing E)");
  if (!done) return invalid_argument("cuda::moe_gate_route_and_group: no done counter");
  const RouterArgs a = router_args(c);
  const int warps = route_warps(a.experts);
  const size_t smem = (size_t(n) * a.experts + size_t(warps) * 2 * a.experts) * sizeof(float);
  static const cudaError_t attr = cudaFuncSetAttribute(
      gate_route_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBudget));
  KILN_RETURN_IF_ERROR(check_cuda(attr, "cuda::moe_gate_route_and_group: shared memory limit"));
  const unsigned blocks = static_cast<unsigned>((a.experts + kGateGroups - 1) / kGateGroups);
  return check_cuda(launch_pdl(gate_route_group_kernel, dim3(blocks), dim3(kGroupThreads), smem, stream, x, n, hidden,
                                w, logits, bias, a, warps, ids, weights, d, done),
                    "cuda::moe_gate_route_and_group");
}

}  // namespace kiln::cuda

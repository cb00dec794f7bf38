#include <algorithm>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_group_device.cuh"
#include "kernels/cuda/moe_route_device.cuh"
#include "kernels/cuda/moe_route_group.h"
#include "kernels/cuda/moe_router.h"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

// One block: route_warps warps route the tokens (warp w takes tokens w, w + route_warps, ...) into ids / weights,
// then all kGroupThreads threads group the pairs.
__global__ void __launch_bounds__(kGroupThreads) route_group_kernel(const float* __restrict__ logits,
                                                                    const float* __restrict__ bias, int64_t n,
                                                                    RouterArgs a, int warps_routing, int32_t* ids,
                                                                    float* weights, MoeDispatch d) {
  extern __shared__ float s_rows[];  // [warps_routing][2][experts]
  __shared__ GroupSmem group_smem;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < warps_routing) {
    float* prob = s_rows + static_cast<size_t>(warp) * 2 * a.experts;
    for (int64_t t = warp; t < n; t += warps_routing)
      route_token(logits, bias, t, a, prob, prob + a.experts, lane, ids, weights);
  }
  __syncthreads();  // ids written by this block are visible to all its threads
  group_pairs(ids, n * a.top_k, a.experts, d, group_smem);
}

}  // namespace

Status moe_route_and_group(const float* logits, const float* bias, int64_t n, const cpu::MoeRouterConfig& c,
                           int32_t* ids, float* weights, const MoeDispatch& d, StreamHandle stream) {
  if (!router_config_supported(c))
    return invalid_argument(
        "cuda::moe_route_and_group: unsupported router shape (E ≤ 1024, top_k ≤ 32, n_group ≤ 32 dividing E)");
  if (n < 0) return invalid_argument("cuda::moe_route_and_group: n < 0");
  if (n > kFusedRouteMaxTokens) {
    KILN_RETURN_IF_ERROR(moe_route(logits, bias, n, c, ids, weights, stream));
    return moe_group_by_expert(ids, n * c.top_k, c.num_experts, d, stream);
  }
  const RouterArgs a = router_args(c);
  const int warps = route_warps(a.experts);
  const size_t smem = size_t(warps) * 2 * a.experts * sizeof(float);
  static const cudaError_t attr = cudaFuncSetAttribute(route_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(kRouteSmemBudget));
  KILN_RETURN_IF_ERROR(check_cuda(attr, "cuda::moe_route_and_group: shared memory limit"));
  route_group_kernel<<<1, kGroupThreads, smem, stream>>>(logits, bias, n, a, warps, ids, weights, d);
  return check_launch("cuda::moe_route_and_group");
}

}  // namespace kiln::cuda

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_route_device.cuh"
#include "kernels/cuda/moe_router.h"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

constexpr int kWarpsPerBlock = 4;

__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t n,
                                 RouterArgs a, int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float s_prob[kWarpsPerBlock][kMaxRouterExperts];
  __shared__ float s_choice[kWarpsPerBlock][kMaxRouterExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= n) return;
  route_token(logits, bias, t, a, s_prob[warp], s_choice[warp], lane, ids, weights);
}

}  // namespace

Status moe_route(const float* logits, const float* bias, int64_t n, const cpu::MoeRouterConfig& c, int32_t* ids,
                 float* weights, StreamHandle stream) {
  if (!router_config_supported(c))
    return invalid_argument("cuda::moe_route: unsupported router shape (E ≤ 1024, top_k ≤ 32, n_group ≤ 32 dividing E)");
  if (n <= 0) return ok_status();
  moe_route_kernel<<<blocks_for(n, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(logits, bias, n,
                                                                                        router_args(c), ids, weights);
  return check_launch("cuda::moe_route");
}

}  // namespace kiln::cuda

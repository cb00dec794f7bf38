#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_gate_device.cuh"
#include "kernels/cuda/moe_gate_gemv.h"

namespace kiln::cuda {
namespace {

using namespace moe_detail;

// One block of kGateThreads threads per expert.
__global__ void __launch_bounds__(kGateThreads)
    gate_gemv_kernel(const uint16_t* __restrict__ x, int64_t n, int64_t hidden, const float* __restrict__ w,
                     int64_t experts, float* __restrict__ logits) {
  __shared__ float s_part[kGateWarps][kGateTokens];
  gate_logits_for_expert(x, n, hidden, w, experts, blockIdx.x, static_cast<int>(threadIdx.x), s_part, 0, logits);
}

}  // namespace

Status moe_gate_logits_bf16(const uint16_t* x, int64_t n, int64_t hidden, const float* w, int64_t experts,
                            float* logits, StreamHandle stream) {
  if (n < 0 || hidden <= 0 || hidden % 4 != 0 || experts < 1 || experts > 65535)
    return invalid_argument(
        "cuda::moe_gate_logits_bf16: need n ≥ 0, hidden a positive multiple of 4, 1 ≤ experts ≤ 65535");
  if (reinterpret_cast<uintptr_t>(x) % 8 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0)
    return invalid_argument("cuda::moe_gate_logits_bf16: x must be 8-byte and w 16-byte aligned");
  if (n == 0) return ok_status();
  gate_gemv_kernel<<<static_cast<unsigned>(experts), kGateThreads, 0, stream>>>(x, n, hidden, w, experts, logits);
  return check_launch("cuda::moe_gate_logits_bf16");
}

}  // namespace kiln::cuda

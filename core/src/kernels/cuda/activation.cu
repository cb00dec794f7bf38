#include "kernels/cuda/activation.h"
#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

__global__ void swiglu_kernel(const uint16_t* __restrict__ gate, const uint16_t* __restrict__ up, int64_t n,
                              int64_t inter, int64_t in_stride, float limit, uint16_t* __restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * inter) return;
  const int64_t t = idx / inter;
  const int64_t i = idx % inter;
  const float g = fminf(bf16_bits_to_float(gate[t * in_stride + i]), limit);
  const float u = fminf(fmaxf(bf16_bits_to_float(up[t * in_stride + i]), -limit), limit);
  out[idx] = float_to_bf16_bits(g / (1.0f + expf(-g)) * u);
}

}  // namespace

Status swiglu_bf16(const uint16_t* gate, const uint16_t* up, int64_t n, int64_t inter, int64_t in_stride,
                   uint16_t* out, StreamHandle stream, float limit) {
  if (n < 0 || inter <= 0 || in_stride < inter)
    return invalid_argument("cuda::swiglu_bf16: need n ≥ 0, inter > 0 and in_stride ≥ inter");
  if (n == 0) return ok_status();
  constexpr int kThreads = 256;
  swiglu_kernel<<<blocks_for(n * inter, kThreads), kThreads, 0, stream>>>(gate, up, n, inter, in_stride, limit, out);
  return check_launch("cuda::swiglu_bf16");
}

}  // namespace kiln::cuda

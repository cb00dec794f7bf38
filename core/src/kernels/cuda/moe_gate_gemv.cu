#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/moe_gate_gemv.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTokens = 8;  // tokens sharing each weight load

// One block per expert. Thread i owns columns 4i + 4·kThreads·j (j = 0, 1, ...): it sums their products in that
// order with fmaf, then the warp sums its lanes (xor butterfly) and thread t adds the kWarps warp sums of token t
// in warp order. None of that depends on n: the token groups only repeat it.
__global__ void __launch_bounds__(kThreads)
    gate_gemv_kernel(const uint16_t* __restrict__ x, int64_t n, int64_t hidden, const float* __restrict__ w,
                     int64_t experts, float* __restrict__ logits) {
  __shared__ float s_part[kWarps][kTokens];
  const int64_t e = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* we = w + e * hidden;
  for (int64_t t0 = 0; t0 < n; t0 += kTokens) {
    const int count = static_cast<int>(n - t0 < kTokens ? n - t0 : kTokens);
    float acc[kTokens] = {};
    for (int64_t k = 4 * threadIdx.x; k < hidden; k += 4 * kThreads) {
      const float4 wv = __ldg(reinterpret_cast<const float4*>(we + k));
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= count) break;
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(x + (t0 + t) * hidden + k));
        acc[t] = fmaf(wv.x, __uint_as_float(raw.x << 16), acc[t]);
        acc[t] = fmaf(wv.y, __uint_as_float(raw.x & 0xffff0000u), acc[t]);
        acc[t] = fmaf(wv.z, __uint_as_float(raw.y << 16), acc[t]);
        acc[t] = fmaf(wv.w, __uint_as_float(raw.y & 0xffff0000u), acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
#pragma unroll
      for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(~0u, acc[t], off);
      if (lane == 0) s_part[warp][t] = acc[t];
    }
    __syncthreads();
    if (threadIdx.x < count) {
      float s = s_part[0][threadIdx.x];
#pragma unroll
      for (int wi = 1; wi < kWarps; ++wi) s += s_part[wi][threadIdx.x];
      logits[(t0 + threadIdx.x) * experts + e] = s;
    }
    __syncthreads();  // s_part is rewritten by the next token group
  }
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
  gate_gemv_kernel<<<static_cast<unsigned>(experts), kThreads, 0, stream>>>(x, n, hidden, w, experts, logits);
  return check_launch("cuda::moe_gate_logits_bf16");
}

}  // namespace kiln::cuda

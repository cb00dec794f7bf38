#include "kernels/cuda/dsa_indexer.h"
#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

constexpr int kHeadDim = 128;
constexpr int kThreads = 256;

// grid (key blocks, queries); one thread per key, the query's heads in shared memory (broadcast reads).
template <int kHeads>
__global__ void __launch_bounds__(kThreads) indexer_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                                                           const float* __restrict__ w, int64_t t_q, int64_t t_kv,
                                                           float scale, float* __restrict__ scores) {
  __shared__ __align__(16) float s_q[kHeads * kHeadDim];
  __shared__ float s_w[kHeads];
  const int64_t s = blockIdx.y;
  for (int i = threadIdx.x; i < kHeads * kHeadDim; i += kThreads)
    s_q[i] = bf16_bits_to_float(q[s * kHeads * kHeadDim + i]);
  if (threadIdx.x < kHeads) s_w[threadIdx.x] = w[s * kHeads + threadIdx.x];
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= t_kv) return;
  const int64_t visible = t_kv - t_q + s + 1;
  if (t >= visible) {
    scores[s * t_kv + t] = -INFINITY;
    return;
  }
  float acc[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) acc[h] = 0.f;
  const uint4* kr = reinterpret_cast<const uint4*>(k + t * kHeadDim);
#pragma unroll 1
  for (int dc = 0; dc < kHeadDim / 8; ++dc) {
    float kf[8];
    bf16x8_to_float(kr[dc], kf);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float4 qa = *reinterpret_cast<const float4*>(s_q + h * kHeadDim + dc * 8);
      const float4 qb = *reinterpret_cast<const float4*>(s_q + h * kHeadDim + dc * 8 + 4);
      acc[h] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                qb.z * kf[6] + qb.w * kf[7];
    }
  }
  float total = 0.f;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) total += s_w[h] * fmaxf(acc[h] * scale, 0.f);
  scores[s * t_kv + t] = total;
}

}  // namespace

Status dsa_indexer_scores_bf16(const uint16_t* q, const uint16_t* k, const float* w, int64_t t_q, int64_t t_kv,
                               int64_t num_heads, float scale, float* scores, StreamHandle stream) {
  if (t_q < 0 || t_kv < t_q) return invalid_argument("cuda::dsa_indexer_scores_bf16: need 0 ≤ t_q ≤ t_kv");
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0) return invalid_argument("cuda::dsa_indexer_scores_bf16: k not 16-byte aligned");
  if (t_q == 0 || t_kv == 0) return ok_status();
  const dim3 grid(blocks_for(t_kv, kThreads), static_cast<unsigned>(t_q));
  if (num_heads == 32)
    indexer_kernel<32><<<grid, kThreads, 0, stream>>>(q, k, w, t_q, t_kv, scale, scores);
  else if (num_heads == 64)
    indexer_kernel<64><<<grid, kThreads, 0, stream>>>(q, k, w, t_q, t_kv, scale, scores);
  else
    return invalid_argument("cuda::dsa_indexer_scores_bf16: num_heads must be 32 or 64, got " +
                            std::to_string(num_heads));
  return check_launch("cuda::dsa_indexer_scores_bf16");
}

}  // namespace kiln::cuda

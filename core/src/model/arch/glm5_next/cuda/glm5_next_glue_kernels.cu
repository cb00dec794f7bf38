#include "model/arch/glm5_next/cuda/glm5_next_glue_kernels.h"

#include <algorithm>

#include "kernels/cuda/launch_check.cuh"

namespace kiln::glm5_next::cuda {
namespace {

using kiln::cuda::bf16_bits_to_float;
using kiln::cuda::check_launch;
using kiln::cuda::float_to_bf16_bits;

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float load_value(const uint16_t* p, int64_t i) { return bf16_bits_to_float(p[i]); }
__device__ __forceinline__ float load_value(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void store_value(uint16_t* p, int64_t i, float v) { p[i] = float_to_bf16_bits(v); }
__device__ __forceinline__ void store_value(float* p, int64_t i, float v) { p[i] = v; }

template <typename T>
__global__ void hc_broadcast_kernel(const T* __restrict__ e, int64_t n, int streams, int64_t dim,
                                    float* __restrict__ x) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t t = i / dim, d = i % dim;
  const float v = load_value(e, i);
  for (int s = 0; s < streams; ++s) x[(t * streams + s) * dim + d] = v;
}

template <typename T>
__global__ void hc_mean_kernel(const float* __restrict__ x, int64_t n, int streams, int64_t dim, T* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t t = i / dim, d = i % dim;
  float sum = 0.f;
  for (int s = 0; s < streams; ++s) sum += x[(t * streams + s) * dim + d];
  store_value(out, i, sum / static_cast<float>(streams));
}

// One warp per (pool, sequence): 32 lanes × float4 = a 128-float key.
__global__ void gather_pool_keys_kernel(const float* __restrict__ keys, const int32_t* __restrict__ tables,
                                        int64_t max_blocks, int64_t block_size, int64_t pool,
                                        const int32_t* __restrict__ num_pools, const int32_t* __restrict__ pool_offset,
                                        int64_t max_pools, float* __restrict__ out) {
  const int s = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int64_t warps = gridDim.x * static_cast<int64_t>(blockDim.x / 32);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; p < num_pools[s];
       p += warps) {
    const int64_t t = p * pool;
    const int64_t slot = static_cast<int64_t>(tables[s * max_blocks + t / block_size]) * block_size + t % block_size;
    const float4* src = reinterpret_cast<const float4*>(keys + (slot / pool) * 128);
    float4* dst = reinterpret_cast<float4*>(out + (pool_offset[s] + p) * 128);
    dst[lane] = src[lane];
  }
}

__global__ void scatter_rows_skip_kernel(const float* __restrict__ src, const int32_t* __restrict__ dst, int64_t n,
                                         int64_t dim, float* __restrict__ keys) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t r = i / dim;
  if (dst[r] < 0) return;
  keys[static_cast<int64_t>(dst[r]) * dim + i % dim] = src[i];
}

}  // namespace

Status hc_broadcast(const uint16_t* e, int64_t n, int64_t streams, int64_t dim, float* x, StreamHandle stream) {
  if (n == 0) return ok_status();
  hc_broadcast_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(e, n, static_cast<int>(streams), dim, x);
  return check_launch("hc_broadcast");
}

Status hc_broadcast_f32(const float* e, int64_t n, int64_t streams, int64_t dim, float* x, StreamHandle stream) {
  if (n == 0) return ok_status();
  hc_broadcast_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(e, n, static_cast<int>(streams), dim, x);
  return check_launch("hc_broadcast_f32");
}

Status hc_mean_bf16(const float* x, int64_t n, int64_t streams, int64_t dim, uint16_t* out, StreamHandle stream) {
  if (n == 0) return ok_status();
  hc_mean_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(x, n, static_cast<int>(streams), dim, out);
  return check_launch("hc_mean_bf16");
}

Status hc_mean_f32(const float* x, int64_t n, int64_t streams, int64_t dim, float* out, StreamHandle stream) {
  if (n == 0) return ok_status();
  hc_mean_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(x, n, static_cast<int>(streams), dim, out);
  return check_launch("hc_mean_f32");
}

Status gather_pool_keys(const float* keys, const int32_t* tables, int64_t max_blocks, int64_t block_size, int64_t pool,
                        const int32_t* num_pools, const int32_t* pool_offset, int64_t seqs, int64_t max_pools,
                        float* out, StreamHandle stream) {
  if (seqs == 0 || max_pools == 0) return ok_status();
  if (block_size % pool != 0) return invalid_argument("gather_pool_keys: block_size must be a multiple of the pool");
  constexpr int kWarps = 8;
  const int64_t grid = std::min<int64_t>((max_pools + kWarps - 1) / kWarps, 1024);
  gather_pool_keys_kernel<<<dim3(static_cast<unsigned>(grid), static_cast<unsigned>(seqs)), kWarps * 32, 0, stream>>>(
      keys, tables, max_blocks, block_size, pool, num_pools, pool_offset, max_pools, out);
  return check_launch("gather_pool_keys");
}

Status scatter_rows_skip(const float* src, const int32_t* dst, int64_t n, int64_t dim, float* keys,
                         StreamHandle stream) {
  if (n == 0) return ok_status();
  scatter_rows_skip_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(src, dst, n, dim, keys);
  return check_launch("scatter_rows_skip");
}

}  // namespace kiln::glm5_next::cuda

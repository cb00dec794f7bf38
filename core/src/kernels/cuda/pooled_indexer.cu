#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pooled_indexer.h"
#include "kernels/cuda/topk.h"

namespace kiln::cuda {
namespace {

constexpr int kDim = 128;
constexpr int kMaxHeads = 64;
constexpr int kScoreThreads = 128;

__global__ void __launch_bounds__(kDim) pool_key_kernel(const float* __restrict__ k, int64_t k_stride,
                                                        const float* __restrict__ gate, int64_t gate_stride,
                                                        const float* __restrict__ ape,
                                                        const int32_t* __restrict__ first_row,
                                                        const int32_t* __restrict__ dst_row, int pool,
                                                        float* __restrict__ keys) {
  const int c = threadIdx.x;
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r0 = first_row[blockIdx.x];
  float mx = -INFINITY;
  for (int j = 0; j < pool; ++j) mx = fmaxf(mx, gate[(r0 + j) * gate_stride + c] + ape[j * kDim + c]);
  float sum = 0.f, acc = 0.f;
  for (int j = 0; j < pool; ++j) {
    const float e = expf(gate[(r0 + j) * gate_stride + c] + ape[j * kDim + c] - mx);
    sum += e;
    acc += e * k[(r0 + j) * k_stride + c];
  }
  keys[static_cast<int64_t>(dst_row[blockIdx.x]) * kDim + c] = acc / sum;
}

// grid (pool blocks of 128, queries): one thread per pool, its key in registers, the query's heads in shared
// memory (broadcast reads), heads summed in order.
__global__ void __launch_bounds__(kScoreThreads) score_kernel(const float* __restrict__ q, const float* __restrict__ w,
                                                              const float* __restrict__ keys, int64_t num_pools,
                                                              int heads, float scale, int64_t q_pos0, const int64_t* __restrict__ positions, int64_t pool,
                                                              float* __restrict__ scores) {
  __shared__ __align__(16) float s_q[kMaxHeads * kDim];
  __shared__ float s_w[kMaxHeads];
  const int64_t s = blockIdx.y;
  pdl_wait();
  pdl_launch_dependents();
  for (int i = threadIdx.x; i < heads * kDim; i += kScoreThreads) s_q[i] = q[s * heads * kDim + i];
  if (threadIdx.x < heads) s_w[threadIdx.x] = w[s * heads + threadIdx.x];
  __syncthreads();
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kScoreThreads + threadIdx.x;
  if (p >= num_pools) return;
  const int64_t q_pos = positions ? positions[s] : q_pos0 + s;
  if (p * pool + pool - 1 > q_pos) {
    scores[s * num_pools + p] = -INFINITY;
    return;
  }
  float4 key[kDim / 4];
  const float4* kr = reinterpret_cast<const float4*>(keys + p * kDim);
#pragma unroll
  for (int i = 0; i < kDim / 4; ++i) key[i] = kr[i];
  float total = 0.f;
  for (int hh = 0; hh < heads; ++hh) {
    const float4* qh = reinterpret_cast<const float4*>(s_q + hh * kDim);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kDim / 4; ++i) {
      const float4 qv = qh[i];
      dot += qv.x * key[i].x + qv.y * key[i].y + qv.z * key[i].z + qv.w * key[i].w;
    }
    total += s_w[hh] * fmaxf(dot * scale, 0.f);
  }
  scores[s * num_pools + p] = total;
}

// Rows of at most kSmallTopKRow pools rank in one block: a bitonic sort of (score, pool) in shared memory, in
// topk_rows's order (score descending, NaN last, ties to the lower pool), the first `top` written (−1 past n).
// A decode step's few hundred pools take a few µs this way; topk_rows's radix passes cost ~35 µs at any size.
constexpr int64_t kSmallTopKRow = 4096;
constexpr int kSmallTopKThreads = 512;

__device__ __forceinline__ bool ranks_before(float a, int32_t ia, float b, int32_t ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

__global__ void __launch_bounds__(kSmallTopKThreads) small_topk_kernel(const float* __restrict__ scores, int64_t n,
                                                                       int64_t top, int32_t* __restrict__ out) {
  __shared__ float s_v[kSmallTopKRow];
  __shared__ int32_t s_i[kSmallTopKRow];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    s_v[i] = i < n ? scores[row * n + i] : __int_as_float(0x7fffffff);  // padding: NaN with the highest index
    s_i[i] = i;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const bool ascending = (i & k) == 0;  // "ascending" = in rank order
          const bool swap = ascending ? ranks_before(s_v[l], s_i[l], s_v[i], s_i[i])
                                      : ranks_before(s_v[i], s_i[i], s_v[l], s_i[l]);
          if (swap) {
            const float v = s_v[i];
            s_v[i] = s_v[l], s_v[l] = v;
            const int32_t x = s_i[i];
            s_i[i] = s_i[l], s_i[l] = x;
          }
        }
      }
      __syncthreads();
    }
  for (int64_t j = threadIdx.x; j < top; j += blockDim.x) out[row * top + j] = j < n ? s_i[j] : -1;
}

// One block per query: the ranked pools' positions, the tail, −1.
__global__ void __launch_bounds__(256) expand_kernel(const int32_t* __restrict__ ranked, int64_t top, int64_t num_pools,
                                                     int64_t q_pos0, const int64_t* __restrict__ positions, int64_t pool, bool select_tail,
                                                     int32_t* __restrict__ out, int64_t width) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t s = blockIdx.x;
  const int64_t q_pos = positions ? positions[s] : q_pos0 + s;
  const int64_t candidates = min(num_pools, (q_pos + 1) / pool);
  const int64_t m = min(top, candidates);
  const int64_t tc = select_tail ? (q_pos + 1) % pool : 0;
  const int64_t tail_first = q_pos + 1 - tc;
  int32_t* row = out + s * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    int32_t v = -1;
    if (i < m * pool) {
      v = static_cast<int32_t>(static_cast<int64_t>(ranked[s * top + i / pool]) * pool + i % pool);
    } else if (i < m * pool + tc) {
      v = static_cast<int32_t>(tail_first + (i - m * pool));
    }
    row[i] = v;
  }
}

}  // namespace

Status pooled_indexer_pool_keys(const float* k, int64_t k_stride, const float* gate, int64_t gate_stride,
                                const float* ape, const int32_t* first_row, const int32_t* dst_row, int64_t count,
                                int64_t pool, float* keys, StreamHandle stream) {
  if (count < 0 || pool <= 0 || k_stride < kDim || gate_stride < kDim || !k || !gate || !ape || !first_row ||
      !dst_row || !keys)
    return invalid_argument("cuda::pooled_indexer_pool_keys: bad shape or missing pointer");
  if (count == 0) return ok_status();
  return check_cuda(launch_pdl(pool_key_kernel, dim3(static_cast<unsigned>(count)), dim3(kDim), 0, stream, k, k_stride,
                               gate, gate_stride, ape, first_row, dst_row, static_cast<int>(pool), keys),
                    "cuda::pooled_indexer_pool_keys");
}

Status pooled_indexer_scores(const float* q, const float* w, const float* pool_keys, int64_t t_q, int64_t num_pools,
                             int64_t heads, float scale, int64_t q_pos0, int64_t pool, float* scores,
                             StreamHandle stream, const int64_t* positions) {
  if (t_q < 0 || num_pools < 0 || heads <= 0 || heads > kMaxHeads || pool <= 0 || q_pos0 < 0)
    return invalid_argument("cuda::pooled_indexer_scores: need heads in 1..64, pool > 0, q_pos0 ≥ 0");
  if (reinterpret_cast<uintptr_t>(pool_keys) % 16 != 0)
    return invalid_argument("cuda::pooled_indexer_scores: pool_keys must be 16-byte aligned");
  if (t_q == 0 || num_pools == 0) return ok_status();
  const dim3 grid(blocks_for(num_pools, kScoreThreads), static_cast<unsigned>(t_q));
  return check_cuda(launch_pdl(score_kernel, grid, dim3(kScoreThreads), 0, stream, q, w, pool_keys, num_pools,
                               static_cast<int>(heads), scale, q_pos0, positions, pool, scores),
                    "cuda::pooled_indexer_scores");
}

Status pooled_indexer_select(const float* scores, int64_t t_q, int64_t num_pools, int64_t q_pos0, int64_t pool,
                             int64_t index_topk, bool select_tail, int32_t* workspace, int32_t* out, int64_t width,
                             StreamHandle stream, const int64_t* positions) {
  const int64_t top = pool > 0 ? index_topk / pool : 0;
  if (t_q < 0 || num_pools < 0 || pool <= 0 || top <= 0 || top > kMaxTopK || q_pos0 < 0 ||
      width < index_topk + (select_tail ? pool - 1 : 0))
    return invalid_argument("cuda::pooled_indexer_select: need pool > 0, 1 ≤ index_topk / pool ≤ 2048, and width ≥ "
                            "index_topk (+ pool − 1 with the tail)");
  if (t_q == 0) return ok_status();
  if (num_pools > 0 && num_pools <= kSmallTopKRow) {
    KILN_RETURN_IF_ERROR(check_cuda(launch_pdl(small_topk_kernel, dim3(static_cast<unsigned>(t_q)),
                                               dim3(kSmallTopKThreads), 0, stream, scores, num_pools, top, workspace),
                                    "cuda::pooled_indexer_select (top-k)"));
  } else if (num_pools > 0) {
    KILN_RETURN_IF_ERROR(topk_rows(scores, t_q, num_pools, top, -1, workspace, stream));
  }
  return check_cuda(launch_pdl(expand_kernel, dim3(static_cast<unsigned>(t_q)), dim3(256), 0, stream, workspace, top,
                               num_pools, q_pos0, positions, pool, select_tail, out, width),
                    "cuda::pooled_indexer_select");
}

}  // namespace kiln::cuda

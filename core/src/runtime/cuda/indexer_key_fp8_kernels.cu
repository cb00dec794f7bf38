#include "runtime/cuda/indexer_key_fp8_kernels.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/launch_check.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kAppendWarps = 4;  // rows per append block, one warp each
constexpr int kScoreThreads = 256;

// Exact: every e4m3 value is a normal or subnormal half, every half a float.
__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code & 0xFFu), __NV_E4M3);
  return __half2float(__half(h));
}

// Warp w of block b quantizes row b · kAppendWarps + w; lane i takes values i, i + 32, ... of it.
__global__ void __launch_bounds__(kAppendWarps* kWarp)
    append_fp8_kernel(const float* k, int64_t n, int64_t dim, const int64_t* slots, uint8_t* cache) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kAppendWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (t >= n) return;  // whole warps leave together: the shuffles below see full warps only
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const float* src = k + t * dim;
  float amax = 0.0f;
  for (int64_t i = lane; i < dim; i += kWarp) amax = fmaxf(amax, fabsf(src[i]));
  for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // As the host codec: IEEE divisions (not the fast reciprocal), so the codes and the scale are the same bytes.
  const float scale = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
  uint8_t* dst = cache + slot * (dim + 4);
  for (int64_t i = lane; i < dim; i += kWarp)
    dst[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(src[i], scale), __NV_SATFINITE, __NV_E4M3));
  if (lane == 0) *reinterpret_cast<float*>(dst + dim) = scale;
}

// As dsa_indexer_scores_kernel (model_glue_kernels.cu): one query row per blockIdx.y, its queries and head weights in
// shared memory, one key per thread. The key's codes are read as 4-byte words (rows are dim + 4 bytes, dim a multiple
// of 4, so every row and its scale are word-aligned) and widened as they are multiplied.
__global__ void __launch_bounds__(kScoreThreads) scores_fp8_kernel(DsaIndexerParams p) {
  extern __shared__ float qw[];  // the row's queries [heads · dim], then its head weights [heads]
  const int64_t r = blockIdx.y, HD = p.heads * p.dim, words = p.dim / 4;
  for (int64_t i = threadIdx.x; i < HD; i += blockDim.x) qw[i] = p.q[r * HD + i];
  for (int64_t i = threadIdx.x; i < p.heads; i += blockDim.x) qw[HD + i] = p.w[r * p.heads + i] * p.head_scale;
  __syncthreads();
  const int64_t len = p.kv_len[r];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[r]) * p.max_blocks;
  const uint8_t* keys = static_cast<const uint8_t*>(p.keys);
  for (int64_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.width; t += gridDim.x * blockDim.x) {
    if (t >= len) {
      p.scores[r * p.width + t] = -INFINITY;
      continue;
    }
    const int64_t slot = static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size;
    const uint32_t* row = reinterpret_cast<const uint32_t*>(keys + slot * (p.dim + 4));
    const float key_scale = __uint_as_float(__ldg(row + words));
    float total = 0.0f;
    for (int64_t h = 0; h < p.heads; ++h) {
      const float* qh = qw + h * p.dim;
      float dot = 0.0f;
      for (int64_t j = 0; j < words; ++j) {
        const uint32_t c = __ldg(row + j);  // codes 4j .. 4j + 3, little-endian
        dot += qh[4 * j] * e4m3_to_float(c);
        dot += qh[4 * j + 1] * e4m3_to_float(c >> 8);
        dot += qh[4 * j + 2] * e4m3_to_float(c >> 16);
        dot += qh[4 * j + 3] * e4m3_to_float(c >> 24);
      }
      total += qw[HD + h] * fmaxf(dot * key_scale * p.scale, 0.0f);
    }
    p.scores[r * p.width + t] = total;
  }
}

}  // namespace

Status indexer_keys_append_fp8(const float* k, int64_t n, int64_t dim, const int64_t* slots, uint8_t* cache,
                               StreamHandle stream) {
  if (n == 0) return ok_status();
  if (dim <= 0 || dim % 4 != 0 || !k || !slots || !cache)
    return invalid_argument("cuda::indexer_keys_append_fp8: dim must be a positive multiple of 4 (got " +
                            std::to_string(dim) + ") and every pointer set");
  const unsigned blocks = static_cast<unsigned>((n + kAppendWarps - 1) / kAppendWarps);
  append_fp8_kernel<<<blocks, kAppendWarps * kWarp, 0, stream>>>(k, n, dim, slots, cache);
  return check_launch("indexer_keys_append_fp8");
}

Status dsa_indexer_scores_paged_fp8(const DsaIndexerParams& p, StreamHandle stream) {
  if (p.rows == 0) return ok_status();
  if (p.dim <= 0 || p.dim % 4 != 0)
    return invalid_argument("cuda::dsa_indexer_scores_paged: fp8 key rows need index_head_dim a multiple of 4 (got " +
                            std::to_string(p.dim) + ")");
  if (p.heads * p.dim > 8192)
    return invalid_argument("cuda::dsa_indexer_scores_paged: index_n_heads · index_head_dim exceeds 8192");
  const size_t smem = static_cast<size_t>(p.heads * p.dim + p.heads) * sizeof(float);
  const unsigned col_blocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((p.width + kScoreThreads - 1) / kScoreThreads, 64)));
  scores_fp8_kernel<<<dim3(col_blocks, static_cast<unsigned>(p.rows)), kScoreThreads, smem, stream>>>(p);
  return check_launch("dsa_indexer_scores_paged (fp8 keys)");
}

}  // namespace kiln::cuda

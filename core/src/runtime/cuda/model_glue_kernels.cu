#include "runtime/cuda/model_glue_kernels.h"

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/launch_check.cuh"
#include "runtime/cuda/block_reduce.cuh"
#include "runtime/cuda/indexer_key_fp8_kernels.h"
#include "runtime/cuda/mla_cache_row.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 32u ? (blocks == 0 ? 1 : blocks) : 65535u * 32u);
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_uniform_kernel(uint16_t* p, size_t n, float bound, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull)) >> 40) * (1.0f / 16777216.0f);
    p[i] = float_to_bf16_bits((2.0f * u - 1.0f) * bound);
  }
}

__global__ void fill_uniform_f32_kernel(float* p, size_t n, float bound, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull)) >> 40) * (1.0f / 16777216.0f);
    p[i] = (2.0f * u - 1.0f) * bound;
  }
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

__global__ void fill_f32_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

__global__ void f32_to_bf16_kernel(const float* in, size_t n, uint16_t* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = float_to_bf16_bits(in[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits_to_float(in[i]);
}

// Eight values a thread in 16-byte loads and stores (the MoE gate's fp32 copy of a prefill chunk's rows: scalar
// 2-byte loads ran it at a third of the bytes' rate). n8 = n / 8; the caller checked the alignment.
__global__ void bf16_to_f32_x8_kernel(const uint4* in, size_t n8, float4* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = in[i];
    out[2 * i] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                             __uint_as_float(v.y & 0xffff0000u));
    out[2 * i + 1] = make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                                 __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
  }
}

__global__ void offset_ids_kernel(const int32_t* ids, int64_t n, int32_t offset, int32_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ids[i] - offset;
}

__global__ void transpose_w_uk_kernel(const uint16_t* kv_b, int64_t heads, int64_t nope, int64_t v, int64_t latent,
                                      uint16_t* out) {
  const int64_t total = heads * latent * nope;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = o % nope, l = (o / nope) % latent, h = o / (nope * latent);
    out[o] = kv_b[(h * (nope + v) + i) * latent + l];
  }
}

__global__ void mla_write_cache_kernel(const float* ckv, int64_t L, int64_t R, const uint16_t* w, float eps,
                                       const int64_t* slots, uint16_t* cache) {
  const int64_t t = blockIdx.x;
  mla_write_cache_row(ckv + t * (L + R), L, R, w, eps, cache + slots[t] * (L + R));
}

__global__ void mla_reference_kernel(MlaReferenceParams p) {
  extern __shared__ float q[];
  __shared__ float red[32];
  const int64_t h = blockIdx.x, r = blockIdx.y, D = p.latent_dim + p.rope_dim;
  const float* qr = p.q + (r * p.heads + h) * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) q[i] = qr[i];
  __syncthreads();
  const int64_t len = p.kv_len[r];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[r]) * p.max_blocks;
  // Candidate j is key position j, or with a selection the j-th selected position (−1: none).
  const int32_t* sel = p.selected ? p.selected + r * p.selected_width : nullptr;
  const int64_t candidates = sel ? p.selected_width : len;
  auto key_of = [&](int64_t j) -> int64_t {
    const int64_t t = sel ? sel[j] : j;
    return t >= 0 && t < len ? t : -1;
  };
  auto row_of = [&](int64_t t) {
    return p.cache + (static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size) * D;
  };
  float* s = p.scores + (r * p.heads + h) * p.max_kv_len;
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) {
    const int64_t t = key_of(j);
    if (t < 0) {
      s[j] = -INFINITY;
      continue;
    }
    const uint16_t* k = row_of(t);
    float dot = 0.0f;
    for (int64_t i = 0; i < D; ++i) dot += q[i] * bf16_bits_to_float(k[i]);
    s[j] = dot * p.scale;
    m = fmaxf(m, s[j]);
  }
  m = block_reduce<true>(m, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) {
    s[j] = key_of(j) < 0 ? 0.0f : __expf(s[j] - m);
    sum += s[j];
  }
  sum = block_reduce<false>(sum, red);
  __syncthreads();
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (p.lse && threadIdx.x == 0) p.lse[r * p.heads + h] = sum > 0.0f ? m + logf(sum) : -INFINITY;
  float* out = p.out + (r * p.heads + h) * p.latent_dim;
  for (int64_t l = threadIdx.x; l < p.latent_dim; l += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < candidates; ++j) {
      const int64_t t = key_of(j);
      if (t >= 0) acc += s[j] * bf16_bits_to_float(row_of(t)[l]);
    }
    out[l] = acc * inv;
  }
}

// As cpu::layernorm: mean and variance in fp64, the normalised value rounded to fp32 once, then · w + b as two
// roundings (no fused multiply-add, which the CPU build does not emit), so the indexer's keys get the CPU's bits.
__global__ void layernorm_f32_kernel(const float* x, const float* w, const float* b, int64_t dim, float eps, float* out) {
  __shared__ double red[32];
  const float* row = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i];
  const double mean = block_sum_f64(sum, red) / static_cast<double>(dim);
  double sq = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sq += (row[i] - mean) * (row[i] - mean);
  const double inv = 1.0 / sqrt(block_sum_f64(sq, red) / static_cast<double>(dim) + static_cast<double>(eps));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    o[i] = __fadd_rn(__fmul_rn(static_cast<float>((row[i] - mean) * inv), w[i]), b[i]);
}

__global__ void scatter_rows_f32_kernel(const float* x, int64_t dim, const int64_t* slots, float* cache) {
  const float* row = x + blockIdx.x * dim;
  float* dst = cache + slots[blockIdx.x] * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = row[i];
}

__global__ void dsa_indexer_scores_kernel(DsaIndexerParams p) {
  extern __shared__ float qw[];  // the row's queries [heads · dim], then its head weights [heads]
  const int64_t r = blockIdx.y, HD = p.heads * p.dim;
  for (int64_t i = threadIdx.x; i < HD; i += blockDim.x) qw[i] = p.q[r * HD + i];
  for (int64_t i = threadIdx.x; i < p.heads; i += blockDim.x) qw[HD + i] = p.w[r * p.heads + i] * p.head_scale;
  __syncthreads();
  const int64_t len = p.kv_len[r];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[r]) * p.max_blocks;
  for (int64_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.width; t += gridDim.x * blockDim.x) {
    if (t >= len) {
      p.scores[r * p.width + t] = -INFINITY;
      continue;
    }
    const float* k = static_cast<const float*>(p.keys) +
                     (static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size) * p.dim;
    float total = 0.0f;
    for (int64_t h = 0; h < p.heads; ++h) {
      float dot = 0.0f;
      for (int64_t i = 0; i < p.dim; ++i) dot += qw[h * p.dim + i] * k[i];
      total += qw[HD + h] * fmaxf(dot * p.scale, 0.0f);
    }
    p.scores[r * p.width + t] = total;
  }
}

}  // namespace

Status fill_uniform_bf16(uint16_t* p, size_t n, float bound, uint64_t seed, StreamHandle stream) {
  fill_uniform_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, bound, seed);
  return check_launch("fill_uniform_bf16");
}

Status fill_uniform_f32(float* p, size_t n, float bound, uint64_t seed, StreamHandle stream) {
  fill_uniform_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, bound, seed);
  return check_launch("fill_uniform_f32");
}

Status fill_constant_bf16(uint16_t* p, size_t n, float value, StreamHandle stream) {
  const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  fill_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, bits);
  return check_launch("fill_constant_bf16");
}

Status fill_constant_f32(float* p, size_t n, float value, StreamHandle stream) {
  fill_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, value);
  return check_launch("fill_constant_f32");
}

Status f32_to_bf16(const float* in, size_t n, uint16_t* out, StreamHandle stream) {
  f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, n, out);
  return check_launch("f32_to_bf16");
}

Status bf16_to_f32(const uint16_t* in, size_t n, float* out, StreamHandle stream) {
  if (n % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0)
    bf16_to_f32_x8_kernel<<<grid_for(n / 8), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(in), n / 8,
                                                                     reinterpret_cast<float4*>(out));
  else
    bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, n, out);
  return check_launch("bf16_to_f32");
}

Status offset_ids_i32(const int32_t* ids, int64_t n, int32_t offset, int32_t* out, StreamHandle stream) {
  if (n <= 0) return ok_status();
  offset_ids_kernel<<<grid_for(static_cast<size_t>(n)), kThreads, 0, stream>>>(ids, n, offset, out);
  return check_launch("offset_ids_i32");
}

Status mla_transpose_w_uk(const uint16_t* kv_b, int64_t heads, int64_t nope, int64_t v, int64_t latent,
                          uint16_t* w_uk_t, StreamHandle stream) {
  const int64_t total = heads * latent * nope;
  if (total == 0) return ok_status();
  transpose_w_uk_kernel<<<static_cast<unsigned>(std::min<int64_t>(blocks_for(total, kThreads), 4096)), kThreads, 0,
                          stream>>>(kv_b, heads, nope, v, latent, w_uk_t);
  return check_launch("mla_transpose_w_uk");
}

Status mla_write_cache(const float* ckv, int64_t n, int64_t latent_dim, int64_t rope_dim, const uint16_t* norm_weight,
                       float eps, const int64_t* slots, uint16_t* cache, StreamHandle stream) {
  if (n == 0) return ok_status();
  mla_write_cache_kernel<<<static_cast<unsigned>(n), kMlaCacheRowThreads, 0, stream>>>(
      ckv, latent_dim, rope_dim, norm_weight, eps, slots, cache);
  return check_launch("mla_write_cache");
}

Status mla_attention_reference(const MlaReferenceParams& p, StreamHandle stream) {
  if (p.rows == 0) return ok_status();
  if (p.selected && p.selected_width > p.max_kv_len)
    return invalid_argument("cuda::mla_attention_reference: the score rows are narrower than the selection");
  const size_t smem = static_cast<size_t>(p.latent_dim + p.rope_dim) * sizeof(float);
  if (smem > 48 * 1024) return invalid_argument("cuda::mla_attention_reference: latent + rope width too large");
  mla_reference_kernel<<<dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.rows)), kThreads, smem, stream>>>(p);
  return check_launch("mla_attention_reference");
}

Status layernorm_f32(const float* x, const float* weight, const float* bias, int64_t n, int64_t dim, float eps,
                     float* out, StreamHandle stream) {
  if (n == 0) return ok_status();
  layernorm_f32_kernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(x, weight, bias, dim, eps, out);
  return check_launch("layernorm_f32");
}

Status scatter_rows_f32(const float* x, int64_t n, int64_t dim, const int64_t* slots, float* cache, StreamHandle stream) {
  if (n == 0) return ok_status();
  scatter_rows_f32_kernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(x, dim, slots, cache);
  return check_launch("scatter_rows_f32");
}

Status dsa_indexer_scores_paged(const DsaIndexerParams& p, StreamHandle stream) {
  if (p.rows == 0) return ok_status();
  if (p.heads * p.dim > 8192)
    return invalid_argument("cuda::dsa_indexer_scores_paged: index_n_heads · index_head_dim exceeds 8192");
  if (p.key_format == IndexerKeyFormat::kFp8E4m3Scaled) return dsa_indexer_scores_paged_fp8(p, stream);
  const size_t smem = static_cast<size_t>(p.heads * p.dim + p.heads) * sizeof(float);
  const unsigned col_blocks = static_cast<unsigned>(std::min<int64_t>((p.width + kThreads - 1) / kThreads, 64));
  dsa_indexer_scores_kernel<<<dim3(col_blocks, static_cast<unsigned>(p.rows)), kThreads, smem, stream>>>(p);
  return check_launch("dsa_indexer_scores_paged");
}

}  // namespace kiln::cuda

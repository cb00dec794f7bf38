#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <climits>
#include <cmath>

#include "dflash_cuda_kernels.h"

namespace kiln::dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPerLane = kMaxHeadDim / 32;

__device__ __forceinline__ float bf16_to_f(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
__device__ __forceinline__ uint16_t f_to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// OCP e4m3fn, as the host codec in dflash_model.cpp decodes it.
__device__ __forceinline__ float e4m3_to_f(uint8_t v) {
  const int e = (v >> 3) & 0xF, m = v & 0x7;
  float a;
  if (e == 0xF && m == 0x7) a = __int_as_float(0x7fc00000);
  else if (e == 0) a = ldexpf(static_cast<float>(m), -9);
  else a = ldexpf(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (v & 0x80) ? -a : a;
}
// Round to nearest even, saturating at ±448: the host codec's bytes.
__device__ __forceinline__ uint8_t f_to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float load_cached(const uint8_t* row, int64_t i, bool fp8) {
  return fp8 ? e4m3_to_f(row[i]) : bf16_to_f(reinterpret_cast<const uint16_t*>(row)[i]);
}
__device__ __forceinline__ void store_cached(uint8_t* row, int64_t i, float v, bool fp8) {
  if (fp8) row[i] = f_to_e4m3(v);
  else reinterpret_cast<uint16_t*>(row)[i] = f_to_bf16(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the CTA (kThreads threads); every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float part[kThreads / 32];
  v = warp_sum(v);
  __syncthreads();  // earlier readers of part are done
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) t += part[i];
  return t;
}

// One head held by a warp: lane has dims lane + 32·j, j < per_lane (head_dim = 32·per_lane, a multiple of 64 so the
// rotate-half partner of dim lane + 32·j is lane + 32·(j + per_lane / 2)). RMS-normed with w, then NeoX RoPE.
__device__ void norm_rope_head(float (&v)[kMaxPerLane], int per_lane, const float* w, int64_t position, double eps,
                               double theta) {
  const int lane = threadIdx.x % 32, hd = 32 * per_lane;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j < per_lane) ss += v[j] * v[j];
  ss = warp_sum(ss);
  const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / hd + eps));
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j < per_lane) v[j] = v[j] * r * w[lane + 32 * j];
  const int half = per_lane / 2;
#pragma unroll
  for (int j = 0; j < kMaxPerLane / 2; ++j) {
    if (j >= half) break;
    const int i = lane + 32 * j;
    const double angle = static_cast<double>(position) * pow(theta, -2.0 * i / hd);
    const float cs = static_cast<float>(cos(angle)), sn = static_cast<float>(sin(angle));
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * cs - x2 * sn;
    v[j + half] = x2 * cs + x1 * sn;
  }
}

__global__ void gather_taps_kernel(TapPointers taps, int64_t width, const int32_t* tap_rows, uint16_t* out,
                                   int num_taps) {
  const int64_t r = blockIdx.x;
  const int t = blockIdx.y;
  const float* src = taps.p[t] + static_cast<int64_t>(tap_rows[r]) * width;
  uint16_t* dst = out + (r * num_taps + t) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = f_to_bf16(src[c]);
}

__global__ void rms_norm_kernel(const float* x, const int32_t* src_rows, const float* w, int64_t d, double eps,
                                float* out_f32, uint16_t* out_bf16) {
  const int64_t i = blockIdx.x;
  const float* xi = x + (src_rows ? static_cast<int64_t>(src_rows[i]) : i) * d;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ss += xi[c] * xi[c];
  ss = block_sum(ss);
  const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / d + eps));
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float y = xi[c] * r * w[c];
    if (out_f32) out_f32[i * d + c] = y;
    if (out_bf16) out_bf16[i * d + c] = f_to_bf16(y);
  }
}

// grid (rows, kv_heads), one warp.
__global__ void write_context_kv_kernel(const float* kv, const float* k_norm, const int32_t* positions,
                                        const int64_t* slots, int head_dim, double eps, double theta, bool fp8,
                                        uint8_t* k_cache, uint8_t* v_cache) {
  const int64_t r = blockIdx.x;
  const int g = blockIdx.y, kv_heads = gridDim.y, lane = threadIdx.x, per_lane = head_dim / 32;
  const int64_t kvw = static_cast<int64_t>(kv_heads) * head_dim;
  const float* k = kv + r * 2 * kvw + g * head_dim;
  const float* v = k + kvw;
  float kk[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) kk[j] = j < per_lane ? k[lane + 32 * j] : 0.0f;
  norm_rope_head(kk, per_lane, k_norm, positions[r], eps, theta);
  const int64_t row_bytes = kvw * (fp8 ? 1 : 2);
  uint8_t* krow = k_cache + slots[r] * row_bytes;
  uint8_t* vrow = v_cache + slots[r] * row_bytes;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j < per_lane) {
      const int64_t e = g * head_dim + lane + 32 * j;
      store_cached(krow, e, kk[j], fp8);
      store_cached(vrow, e, v[lane + 32 * j], fp8);
    }
}

// grid (rows, heads + kv_heads), one warp: head h < heads is a query head, else key head h − heads.
__global__ void norm_rope_qk_kernel(float* qkv, const float* q_norm, const float* k_norm, const int32_t* positions,
                                    int heads, int kv_heads, int head_dim, double eps, double theta) {
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y, lane = threadIdx.x, per_lane = head_dim / 32;
  float* x = qkv + r * static_cast<int64_t>(heads + 2 * kv_heads) * head_dim + static_cast<int64_t>(h) * head_dim;
  float v[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) v[j] = j < per_lane ? x[lane + 32 * j] : 0.0f;
  norm_rope_head(v, per_lane, h < heads ? q_norm : k_norm, positions[r], eps, theta);
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j < per_lane) x[lane + 32 * j] = v[j];
}

constexpr int kAttnWarps = 8;  // keys in flight per (row, head): the kernel is latency-bound on the cache reads

// grid (rows, heads), kAttnWarps warps: warp w takes keys w, w + kAttnWarps, … with an online softmax of its own;
// the warps' partial results merge at the end (a fixed order, so results do not depend on timing).
__global__ void block_attention_kernel(const float* qkv, BlockRows m, int heads, int kv_heads, int head_dim,
                                       const uint8_t* k_cache, const uint8_t* v_cache, bool fp8, int64_t window,
                                       bool causal, uint16_t* attn) {
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, per_lane = head_dim / 32;
  const int g = h / (heads / kv_heads);
  const int64_t row_width = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim;
  const int64_t kvw = static_cast<int64_t>(kv_heads) * head_dim;
  const int64_t P = m.positions[i];
  const int local = m.local[i], len = m.block_len[i];
  const int64_t first = m.block_start[i];
  const int64_t anchor = P - local;
  const int32_t* table = m.tables + m.table_offset[m.seq[i]];
  const int64_t lo = window > 0 ? (P - window + 1 > 0 ? P - window + 1 : int64_t{0}) : 0;
  const int64_t nctx = anchor > lo ? anchor - lo : 0;
  const int64_t row_bytes = kvw * (fp8 ? 1 : 2);
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));

  float q[kMaxPerLane], acc[kMaxPerLane];
  const float* qrow = qkv + i * row_width + static_cast<int64_t>(h) * head_dim;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    q[j] = j < per_lane ? qrow[lane + 32 * j] : 0.0f;
    acc[j] = 0.0f;
  }
  float mx = -INFINITY, l = 0.0f;
  for (int64_t key = warp; key < nctx + len; key += kAttnWarps) {
    float kv_k[kMaxPerLane], kv_v[kMaxPerLane];
    if (key < nctx) {
      const int64_t pos = lo + key;
      const int64_t slot = static_cast<int64_t>(table[pos / m.block_size]) * m.block_size + pos % m.block_size;
      const uint8_t* krow = k_cache + slot * row_bytes;
      const uint8_t* vrow = v_cache + slot * row_bytes;
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j)
        if (j < per_lane) {
          const int64_t e = static_cast<int64_t>(g) * head_dim + lane + 32 * j;
          kv_k[j] = load_cached(krow, e, fp8);
          kv_v[j] = load_cached(vrow, e, fp8);
        }
    } else {
      const int64_t jb = key - nctx;  // the block's own key jb, at position anchor + jb
      const int64_t dist = anchor + jb - P;
      if (window > 0 && (dist >= window || -dist >= window)) continue;
      if (causal && jb > local) continue;
      const float* krow = qkv + (first + jb) * row_width + static_cast<int64_t>(heads) * head_dim + g * head_dim;
      const float* vrow = krow + kvw;
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j)
        if (j < per_lane) kv_k[j] = krow[lane + 32 * j], kv_v[j] = vrow[lane + 32 * j];
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j)
      if (j < per_lane) s += q[j] * kv_k[j];
    s = warp_sum(s) * scale;
    const float nm = fmaxf(mx, s);
    const float corr = __expf(mx - nm), p = __expf(s - nm);  // mx = −inf at first: corr = 0
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j)
      if (j < per_lane) acc[j] = acc[j] * corr + p * kv_v[j];
    mx = nm;
  }
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps], s_acc[kAttnWarps][kMaxHeadDim];
  if (lane == 0) s_m[warp] = mx, s_l[warp] = l;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j < per_lane) s_acc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, s_m[w]);
  float L = 0.0f, wt[kAttnWarps];
  for (int w = 0; w < kAttnWarps; ++w) {
    wt[w] = s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - M);
    L += s_l[w] * wt[w];
  }
  uint16_t* out = attn + i * static_cast<int64_t>(heads) * head_dim + static_cast<int64_t>(h) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) o += s_acc[w][e] * wt[w];
    out[e] = f_to_bf16(L > 0.0f ? o / L : 0.0f);
  }
}

__global__ void dynamic_conv_kernel(const float* x, const float* d, const float* base, const int32_t* local,
                                    int64_t hidden, int taps, int64_t group, int side, uint16_t* out_bf16,
                                    float* residual) {
  const int64_t i = blockIdx.x;
  const int64_t G = hidden / group;
  const int t = local[i];
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float s = 0.0f;
    for (int o = 0; o < taps && o <= t; ++o) {
      const float coef = base[(side * taps + o) * hidden + c] + d[i * 2 * taps * G + (side * taps + o) * G + c / group];
      s += coef * x[(i - o) * hidden + c];
    }
    if (out_bf16) out_bf16[i * hidden + c] = f_to_bf16(s);
    else residual[i * hidden + c] += s;
  }
}

__global__ void embed_to_residual_kernel(const uint16_t* emb, int64_t n, float scale, float* h) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    h[k] = scale == 1.0f ? bf16_to_f(emb[k]) : bf16_to_f(emb[k]) * scale;
}

__global__ void swiglu_kernel(const float* gu, int64_t inter, uint16_t* act) {
  const int64_t r = blockIdx.x;
  for (int64_t c = threadIdx.x; c < inter; c += blockDim.x) {
    const float g = gu[r * 2 * inter + c], u = gu[r * 2 * inter + inter + c];
    act[r * inter + c] = f_to_bf16(g / (1.0f + expf(-g)) * u);
  }
}

__device__ __forceinline__ bool better(float a, int32_t ia, float b, int32_t ib) {
  return a > b || (a == b && ia < ib);
}

// One CTA per row: each thread keeps the k best of its strided share (sorted), then k rounds of a CTA-wide
// arg-best over the threads' heads pop the overall best in order.
__global__ void __launch_bounds__(kThreads) top_k_kernel(const float* logits, int64_t vocab, int k, double multiplier,
                                                          double softcap, int32_t* ids, float* values) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  float val[kMaxTopK];
  int32_t idx[kMaxTopK];
  int count = 0;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    float v = row[c];
    if (multiplier != 1.0) v *= static_cast<float>(multiplier);
    if (softcap > 0) v = static_cast<float>(tanh(v / softcap) * softcap);
    const int32_t id = static_cast<int32_t>(c);
    if (count == k && !better(v, id, val[k - 1], idx[k - 1])) continue;
    int at = count < k ? count++ : k - 1;
    while (at > 0 && better(v, id, val[at - 1], idx[at - 1])) {
      val[at] = val[at - 1], idx[at] = idx[at - 1];
      --at;
    }
    val[at] = v, idx[at] = id;
  }
  __shared__ float s_val[kThreads / 32];
  __shared__ int32_t s_idx[kThreads / 32];
  int head = 0;
  for (int round = 0; round < k; ++round) {
    float bv = head < count ? val[head] : -INFINITY;
    int32_t bi = head < count ? idx[head] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) s_val[threadIdx.x / 32] = bv, s_idx[threadIdx.x / 32] = bi;
    __syncthreads();
    bv = s_val[0], bi = s_idx[0];
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(s_val[w], s_idx[w], bv, bi)) bv = s_val[w], bi = s_idx[w];
    if (head < count && idx[head] == bi) ++head;  // ids are unique: exactly one thread owns the winner
    if (threadIdx.x == 0) ids[r * k + round] = bi, values[r * k + round] = bv;
  }
}

__global__ void __launch_bounds__(kThreads) draft_walk_kernel(WalkArgs a) {
  const int b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = a.first_row[b], depth = a.depth[b], k = a.k;
  const float temperature = a.temperature[b];
  __shared__ float row[kMaxTopK];
  __shared__ int32_t prev;
  if (threadIdx.x == 0) prev = a.anchor[b];
  __syncthreads();
  for (int t = 0; t < depth; ++t) {
    const int64_t m = first + t;
    const int32_t* cand = a.cand_ids + m * k;
    for (int j = warp; j < k; j += kThreads / 32) {
      float s = 0.0f;
      if (a.g) {  // S(prev, b) = U(b) + Σ_r A[prev, r]·g[r]·B[b, r]
        const uint16_t* A = a.predecessor + static_cast<int64_t>(prev) * a.rank;
        const uint16_t* B = a.successor + static_cast<int64_t>(cand[j]) * a.rank;
        const float* g = a.g + m * a.rank;
        for (int64_t r = lane; r < a.rank; r += 32) s += bf16_to_f(A[r]) * g[r] * bf16_to_f(B[r]);
        s = warp_sum(s);
      }
      if (lane == 0) row[j] = a.cand_values[m * k + j] + s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int pick = 0;
      if (temperature <= 0.0f) {
        for (int j = 1; j < k; ++j)
          if (row[j] > row[pick]) pick = j;  // the first maximum
      } else {  // softmax(row / T) and the draw, as the host model makes them
        float mx = -INFINITY;
        for (int j = 0; j < k; ++j) mx = fmaxf(mx, row[j]);
        double sum = 0.0;
        for (int j = 0; j < k; ++j) sum += (row[j] = expf((row[j] - mx) / temperature));
        for (int j = 0; j < k; ++j) row[j] = static_cast<float>(row[j] / sum);
        const double u = a.uniforms[m];
        double acc = 0.0;
        pick = -1;
        for (int j = 0; j < k && pick < 0; ++j) {
          acc += row[j];
          if (u < acc) pick = j;
        }
        for (int j = k - 1; pick < 0 && j >= 0; --j)
          if (row[j] > 0) pick = j;
        if (pick < 0) pick = 0;
        for (int j = 0; j < k; ++j) a.q_ids[m * k + j] = cand[j], a.q_probs[m * k + j] = row[j];
      }
      a.tokens[m] = cand[pick];
      prev = cand[pick];
    }
    __syncthreads();
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(n < 1024 * 1024 ? (n + kThreads - 1) / kThreads : 4096); }

}  // namespace

cudaError_t gather_taps(TapPointers taps, int num_taps, int64_t width, const int32_t* tap_rows, int64_t rows,
                        uint16_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  gather_taps_kernel<<<dim3(static_cast<unsigned>(rows), num_taps), kThreads, 0, stream>>>(taps, width, tap_rows, out,
                                                                                          num_taps);
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, const int32_t* src_rows, const float* w, int64_t rows, int64_t d, double eps,
                     float* out_f32, uint16_t* out_bf16, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, src_rows, w, d, eps, out_f32, out_bf16);
  return cudaGetLastError();
}

cudaError_t write_context_kv(const float* kv, const float* k_norm, const int32_t* positions, const int64_t* slots,
                             int64_t rows, int kv_heads, int head_dim, double eps, double theta, bool fp8,
                             uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  write_context_kv_kernel<<<dim3(static_cast<unsigned>(rows), kv_heads), 32, 0, stream>>>(
      kv, k_norm, positions, slots, head_dim, eps, theta, fp8, k_cache, v_cache);
  return cudaGetLastError();
}

cudaError_t norm_rope_qk(float* qkv, const float* q_norm, const float* k_norm, const int32_t* positions, int64_t rows,
                         int heads, int kv_heads, int head_dim, double eps, double theta, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  norm_rope_qk_kernel<<<dim3(static_cast<unsigned>(rows), heads + kv_heads), 32, 0, stream>>>(
      qkv, q_norm, k_norm, positions, heads, kv_heads, head_dim, eps, theta);
  return cudaGetLastError();
}

cudaError_t block_attention(const float* qkv, int64_t rows, BlockRows meta, int heads, int kv_heads, int head_dim,
                            const uint8_t* k_cache, const uint8_t* v_cache, bool fp8, int64_t window, bool causal,
                            uint16_t* attn, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  block_attention_kernel<<<dim3(static_cast<unsigned>(rows), heads), kAttnWarps * 32, 0, stream>>>(
      qkv, meta, heads, kv_heads, head_dim, k_cache, v_cache, fp8, window, causal, attn);
  return cudaGetLastError();
}

cudaError_t dynamic_conv(const float* x, const float* d, const float* base, const int32_t* local, int64_t rows,
                         int64_t hidden, int taps, int64_t group, int side, uint16_t* out_bf16, float* residual,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  dynamic_conv_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, d, base, local, hidden, taps, group,
                                                                            side, out_bf16, residual);
  return cudaGetLastError();
}

cudaError_t embed_to_residual(const uint16_t* emb, int64_t n, float scale, float* h, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  embed_to_residual_kernel<<<grid_for(n), kThreads, 0, stream>>>(emb, n, scale, h);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gu, int64_t rows, int64_t inter, uint16_t* act, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  swiglu_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(gu, inter, act);
  return cudaGetLastError();
}

cudaError_t top_k(const float* logits, int64_t rows, int64_t vocab, int k, double multiplier, double softcap,
                  int32_t* ids, float* values, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (k < 1 || k > kMaxTopK || k > vocab) return cudaErrorInvalidValue;
  top_k_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, k, multiplier, softcap, ids, values);
  return cudaGetLastError();
}

cudaError_t draft_walk(const WalkArgs& a, int64_t seqs, cudaStream_t stream) {
  if (seqs == 0) return cudaSuccess;
  if (a.k < 1 || a.k > kMaxTopK) return cudaErrorInvalidValue;
  draft_walk_kernel<<<static_cast<unsigned>(seqs), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kiln::dflash::cuda

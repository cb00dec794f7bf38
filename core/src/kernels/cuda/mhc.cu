#include <cooperative_groups.h>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kS = 4;                   // streams
constexpr int kR = (2 + kS) * kS;       // 24 projections
constexpr int kVals = kR + 1;           // + Σx²

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// The maps of one token on 16 lanes (lane sub = 4i + j holds comb[i][j]; lanes 0..3 also pre, 4..7 post), from
// r (the 24 projections in shared memory) · inv (the RMS scale). Every lane of the warp must call it (shuffles); `valid` guards
// the writes. Row sums are xor-shuffles over bits 0–1 of sub, column sums over bits 2–3.
__device__ __forceinline__ void token_maps16(const float* r, float inv, const float* base, const float* scale, float hc_eps,
                                             int iters, int sub, bool valid, float* pre_out, float* post_out,
                                             float* comb_out, float* s_pre) {
  if (valid && sub < kS) {
    const float v = sigmoidf(r[sub] * inv * scale[0] + base[sub]) + hc_eps;
    s_pre[sub] = v;
    if (pre_out) pre_out[sub] = v;
  } else if (valid && sub < 2 * kS && post_out) {
    post_out[sub - kS] = 2.f * sigmoidf(r[sub] * inv * scale[1] + base[sub]);
  }
  const int m = 2 * kS + (sub & 15);
  float P = r[m] * inv * scale[2] + base[m];
  float mx = fmaxf(P, __shfl_xor_sync(0xffffffffu, P, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  P = expf(P - mx);
  float sum = P + __shfl_xor_sync(0xffffffffu, P, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  P = P / sum + hc_eps;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      float rs = P + __shfl_xor_sync(0xffffffffu, P, 1);
      rs += __shfl_xor_sync(0xffffffffu, rs, 2);
      P /= rs + hc_eps;
    }
    float cs = P + __shfl_xor_sync(0xffffffffu, P, 4);
    cs += __shfl_xor_sync(0xffffffffu, cs, 8);
    P /= cs + hc_eps;
  }
  if (valid && comb_out) comb_out[sub & 15] = P;
}

// grid (kSplit, token groups of kTok), clusters of the kSplit CTAs of a group: CTA `rank` takes slice `rank` of
// the flattened 4 · dim values for the 24 projections and Σx² (fn is read once per group, spread over kSplit
// SMs), the cluster's partials are summed in rank order by rank 0 through distributed shared memory, rank 0
// computes the maps, and every CTA collapses its slice of dim with them.
template <int kTok, int kSplit>
__global__ void __cluster_dims__(kSplit, 1, 1) __launch_bounds__(kThreads)
    maps_collapse_kernel(const float* __restrict__ x, int64_t n, MhcDeviceParams p, float* __restrict__ pre,
                         float* __restrict__ post, float* __restrict__ comb, float* __restrict__ h,
                         uint16_t* __restrict__ h_bf16) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float s_part[kWarps][kTok][kVals];
  __shared__ float s_red[kTok][kVals];
  __shared__ float s_pre[kTok][kS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int64_t F4 = kS * p.dim / 4;  // float4s per token
  const int64_t e0 = F4 * rank / kSplit, e1 = F4 * (rank + 1) / kSplit;
  const float4* fn4 = reinterpret_cast<const float4*>(p.fn);
  pdl_wait();
  pdl_launch_dependents();
  float acc[kTok][kVals];
#pragma unroll
  for (int t = 0; t < kTok; ++t)
#pragma unroll
    for (int m = 0; m < kVals; ++m) acc[t][m] = 0.f;
  for (int64_t e = e0 + tid; e < e1; e += kThreads) {
    float4 xv[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      xv[t] = t0 + t < n ? reinterpret_cast<const float4*>(x + (t0 + t) * kS * p.dim)[e] : make_float4(0, 0, 0, 0);
      acc[t][kR] += dot4(xv[t], xv[t]);
    }
#pragma unroll
    for (int mb = 0; mb < kR; mb += 8) {  // 8 rows' loads in flight before their FMAs
      float4 f[8];
#pragma unroll
      for (int m = 0; m < 8; ++m) f[m] = __ldg(fn4 + (mb + m) * F4 + e);
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int t = 0; t < kTok; ++t) acc[t][mb + m] += dot4(xv[t], f[m]);
    }
  }
#pragma unroll
  for (int t = 0; t < kTok; ++t)
#pragma unroll
    for (int m = 0; m < kVals; ++m) {
      float v = acc[t][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) s_part[warp][t][m] = v;
    }
  __syncthreads();
  if (tid < kTok * kVals) {
    const int t = tid / kVals, m = tid % kVals;
    float v = 0.f;
    for (int w = 0; w < kWarps; ++w) v += s_part[w][t][m];
    s_red[t][m] = v;
  }
  cluster.sync();
  if (rank == 0) {
    __shared__ float s_r[kTok][kVals];
    if (tid < kTok * kVals) {  // the ranks' partials summed in rank order
      const int t = tid / kVals, m = tid % kVals;
      float v = 0.f;
      for (int q = 0; q < kSplit; ++q) v += cluster.map_shared_rank(&s_red[0][0], q)[t * kVals + m];
      s_r[t][m] = v;
    }
    __syncthreads();
    if (tid < 32 * ((16 * kTok + 31) / 32)) {
      const int t = tid >> 4 < kTok ? tid >> 4 : kTok - 1;
      const int64_t tok = t0 + t;
      const bool valid = (tid >> 4) < kTok && tok < n;
      const float inv = rsqrtf(s_r[t][kR] / static_cast<float>(kS * p.dim) + p.rms_eps);
      token_maps16(&s_r[t][0], inv, p.base, p.scale, p.hc_eps, static_cast<int>(p.sinkhorn_iters), tid & 15, valid,
                   pre ? pre + tok * kS : nullptr, post ? post + tok * kS : nullptr,
                   comb ? comb + tok * kS * kS : nullptr, &s_pre[t][0]);
    }
  }
  cluster.sync();
  float w_pre[kTok][kS];
  {
    const float* src = cluster.map_shared_rank(&s_pre[0][0], 0);
#pragma unroll
    for (int t = 0; t < kTok; ++t)
#pragma unroll
      for (int i = 0; i < kS; ++i) w_pre[t][i] = src[t * kS + i];
  }
  cluster.sync();  // rank 0's shared memory stays until every CTA has read it
  const int64_t D4 = p.dim / 4;
  const int64_t d0 = D4 * rank / kSplit, d1 = D4 * (rank + 1) / kSplit;
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    const int64_t tok = t0 + t;
    if (tok >= n) break;
    const float4* xt = reinterpret_cast<const float4*>(x + tok * kS * p.dim);
    for (int64_t d = d0 + tid; d < d1; d += kThreads) {
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const float4 v = xt[i * D4 + d];
        const float w = w_pre[t][i];
        o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
      }
      if (h) reinterpret_cast<float4*>(h + tok * p.dim)[d] = o;
      if (h_bf16) {
        const uint2 packed = make_uint2(
            static_cast<uint32_t>(float_to_bf16_bits(o.x)) | (static_cast<uint32_t>(float_to_bf16_bits(o.y)) << 16),
            static_cast<uint32_t>(float_to_bf16_bits(o.z)) | (static_cast<uint32_t>(float_to_bf16_bits(o.w)) << 16));
        reinterpret_cast<uint2*>(h_bf16 + tok * p.dim)[d] = packed;
      }
    }
  }
}

__device__ __forceinline__ float4 load_y(const float* y, int64_t i) { return reinterpret_cast<const float4*>(y)[i]; }
__device__ __forceinline__ float4 load_y(const uint16_t* y, int64_t i) {
  const uint2 raw = reinterpret_cast<const uint2*>(y)[i];
  return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                     __uint_as_float(raw.y & 0xffff0000u));
}

// grid (dim / 4 / 256 blocks, n): one thread per 4 channels of one token, all four streams.
template <typename Y>
__global__ void __launch_bounds__(kThreads) mix_kernel(float* __restrict__ x, const Y* __restrict__ y,
                                                       const float* __restrict__ post, const float* __restrict__ comb,
                                                       int64_t dim) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t tok = blockIdx.y;
  const int64_t D4 = dim / 4;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (d >= D4) return;
  float4* xt = reinterpret_cast<float4*>(x + tok * kS * dim);
  float4 xi[kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) xi[i] = xt[i * D4 + d];
  const float4 yv = load_y(y + tok * dim, d);
  float po[kS], cb[kS * kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) po[i] = post[tok * kS + i];
#pragma unroll
  for (int i = 0; i < kS * kS; ++i) cb[i] = comb[tok * kS * kS + i];
#pragma unroll
  for (int j = 0; j < kS; ++j) {
    float4 o = make_float4(po[j] * yv.x, po[j] * yv.y, po[j] * yv.z, po[j] * yv.w);
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const float c = cb[kS * i + j];
      o.x += c * xi[i].x, o.y += c * xi[i].y, o.z += c * xi[i].z, o.w += c * xi[i].w;
    }
    xt[j * D4 + d] = o;
  }
}

template <typename Y>
Status launch_mix(float* x, const Y* y, const float* post, const float* comb, int64_t n, int64_t dim,
                  StreamHandle stream) {
  if (n < 0 || dim <= 0 || dim % 4 != 0 || !x || !y || !post || !comb)
    return invalid_argument("cuda::mhc_mix: need dim a positive multiple of 4 and every pointer");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % (sizeof(Y) == 4 ? 16 : 8) != 0)
    return invalid_argument("cuda::mhc_mix: x must be 16-byte aligned, y 16 (fp32) or 8 (bf16)");
  if (n == 0) return ok_status();
  const dim3 grid(blocks_for(dim / 4, kThreads), static_cast<unsigned>(n));
  return check_cuda(launch_pdl(mix_kernel<Y>, grid, dim3(kThreads), 0, stream, x, y, post, comb, dim), "cuda::mhc_mix");
}

}  // namespace

Status mhc_maps_collapse(const float* x, int64_t n, const MhcDeviceParams& p, float* pre, float* post, float* comb,
                         float* h, uint16_t* h_bf16, StreamHandle stream) {
  if (n < 0 || p.dim <= 0 || p.dim % 4 != 0 || !x || !p.fn || !p.base || !p.scale || p.sinkhorn_iters < 1)
    return invalid_argument("cuda::mhc_maps_collapse: need dim a positive multiple of 4, fn, base, scale, iters ≥ 1");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.fn) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(h) % 16 != 0 || reinterpret_cast<uintptr_t>(h_bf16) % 8 != 0)
    return invalid_argument("cuda::mhc_maps_collapse: x, fn, h must be 16-byte aligned, h_bf16 8-byte aligned");
  if (n == 0) return ok_status();
  if (n >= 512)
    return check_cuda(launch_pdl(maps_collapse_kernel<4, 1>, dim3(1, blocks_for(n, 4)), dim3(kThreads), 0, stream, x,
                                 n, p, pre, post, comb, h, h_bf16),
                      "cuda::mhc_maps_collapse");
  return check_cuda(launch_pdl(maps_collapse_kernel<1, 8>, dim3(8, static_cast<unsigned>(n)), dim3(kThreads), 0,
                               stream, x, n, p, pre, post, comb, h, h_bf16),
                    "cuda::mhc_maps_collapse");
}

Status mhc_mix(float* x, const uint16_t* y_bf16, const float* post, const float* comb, int64_t n, int64_t dim,
               StreamHandle stream) {
  return launch_mix(x, y_bf16, post, comb, n, dim, stream);
}

Status mhc_mix(float* x, const float* y, const float* post, const float* comb, int64_t n, int64_t dim,
               StreamHandle stream) {
  return launch_mix(x, y, post, comb, n, dim, stream);
}

}  // namespace kiln::cuda

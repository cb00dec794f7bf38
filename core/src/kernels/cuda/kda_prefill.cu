// KDA prefill on the GPU: the short conv over [stored | new] inputs, the chunked (WY) delta rule on the tensor
// cores, and RMSNormGated.
//
// Chunked kernel, per CTA = (head, half of dv, sequence), chunks of C = 64 tokens in order, 16 warps:
//   G = inclusive cumsum of g over the chunk (per channel);
//   A_kk[r,c] = Σ_i k_r k_c e^{G_r − G_c}, A_qk likewise with q_r — per 16 × 16 block (R, C ≤ R) with the
//     reference row s = 16R: (k_r e^{G_r − G_s}) · (k_c e^{G_s − G_c}); both exponents stay below 16 · 5 = 80 < 88
//     for |lower bound| ≤ 5.5 (e^{G_s − G_c} ≤ 1 off the diagonal, ≤ e^75 on it), so no factor overflows;
//   T = (I + β ⊙ strict-lower(A_kk))⁻¹: 16 × 16 diagonal blocks by forward substitution (one warp each, one
//     lane per column), then the off-diagonal blocks by distance, T_RC = −T_RR Σ_K L_RK T_KC;
//   W = T (β K e^G), V′ = T (β V) − W S, O = (Q e^G) S + tril(A_qk) V′, S ← e^{G_last} S + (K e^{G_last − G})ᵀ V′.
// Every product is an m16n8k8 tf32 mma with fp32 accumulation, by default split in three (3xTF32: fp32-accurate); S lives in registers as the accumulator of its
// update (warp w: key rows 16(w mod 8) .., columns 32(w div 8) ..) and in shared memory (fp32) as the B operand of W S and (Q e^G) S.
#include "kernels/cuda/kda.h"
#include "kernels/cuda/kda_common.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

Status kda_recurrent_fallback(const KdaPrefillParams& p, StreamHandle stream);
Status kda_check_slots(const KdaStateSlots& s, int64_t heads, const char* name);

namespace {

using namespace kda_detail;

// ---------------------------------------------------------------------------------------------------------------
// Short conv over [stored 3 | new tokens].

constexpr int kConvThreads = 256;
constexpr int kConvTile = 32;  // tokens per thread

__device__ __forceinline__ int find_seq(const int32_t* cu, int num_seqs, int64_t row) {
  int lo = 0, hi = num_seqs - 1;  // the last s with cu[s] ≤ row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kConvThreads) conv_out_kernel(const uint16_t* __restrict__ in,
                                                                 const float* __restrict__ weight,
                                                                 const int32_t* __restrict__ cu, int num_seqs,
                                                                 int64_t total, int64_t channels, const char* state,
                                                                 int64_t slot_bytes, const int32_t* slot_ids,
                                                                 int64_t state_offset, uint16_t* __restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  float w[4] = {0.f, 0.f, 0.f, 0.f};
  if (c < channels) {
    const float4 wv = *reinterpret_cast<const float4*>(weight + c * 4);
    w[0] = wv.x, w[1] = wv.y, w[2] = wv.z, w[3] = wv.w;
  }
  pdl_wait();
  pdl_launch_dependents();
  if (c >= channels) return;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * kConvTile;
  const int64_t row_end = min(row_begin + kConvTile, total);
  int s = find_seq(cu, num_seqs, row_begin);
  int64_t seq_begin = cu[s], seq_end = cu[s + 1];
  // x(p) for position p of sequence s: the new inputs, or the stored ones before position 0.
  auto x_at = [&](int64_t p) -> float {
    if (p >= 0) return bf16_bits_to_float(in[(seq_begin + p) * channels + c]);
    const float* st = reinterpret_cast<const float*>(state + static_cast<int64_t>(slot_ids[s]) * slot_bytes +
                                                     state_offset);
    return st[(3 + p) * channels + c];
  };
  int64_t pos = row_begin - seq_begin;
  float x0 = x_at(pos - 3), x1 = x_at(pos - 2), x2 = x_at(pos - 1);
  for (int64_t row = row_begin; row < row_end; ++row) {
    while (row >= seq_end) {  // next sequence (empty ones skipped)
      ++s;
      seq_begin = cu[s], seq_end = cu[s + 1];
      if (row < seq_end) {
        x0 = x_at(-3), x1 = x_at(-2), x2 = x_at(-1);
      }
    }
    const float x3 = bf16_bits_to_float(in[row * channels + c]);
    out[row * channels + c] = float_to_bf16_bits(conv_silu(w, x0, x1, x2, x3));
    x0 = x1, x1 = x2, x2 = x3;
  }
}

__global__ void __launch_bounds__(kConvThreads) conv_state_kernel(const uint16_t* __restrict__ in,
                                                                   const int32_t* __restrict__ cu, int64_t channels,
                                                                   char* state, int64_t slot_bytes,
                                                                   const int32_t* slot_ids, int64_t state_offset) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  if (c >= channels) return;
  const int s = blockIdx.y;
  const int64_t begin = cu[s], n = cu[s + 1] - begin;
  float* st = reinterpret_cast<float*>(state + static_cast<int64_t>(slot_ids[s]) * slot_bytes + state_offset);
  float v[3];
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int64_t p = n - 3 + j;
    v[j] = p >= 0 ? bf16_bits_to_float(in[(begin + p) * channels + c]) : st[(n + j) * channels + c];
  }
#pragma unroll
  for (int j = 0; j < 3; ++j) st[j * channels + c] = v[j];
}

// ---------------------------------------------------------------------------------------------------------------
// Chunked delta rule.

constexpr int kThreads = 512;
constexpr int kC = 64;        // chunk
constexpr int kDv = 64;       // dv columns per CTA
constexpr int kKS = 136;      // bf16 row stride of K, Q
constexpr int kVS = 72;       // bf16 row stride of V
constexpr int kGS = 132;      // fp32 row stride of G, W
constexpr int kSS = 72;       // fp32 row stride of S, V′
constexpr int kLS = 68;       // fp32 row stride of L, T, A_qk

constexpr int kOffK = 0;
constexpr int kOffQ = kOffK + kC * kKS * 2;
constexpr int kOffV = kOffQ + kC * kKS * 2;
constexpr int kOffG = kOffV + kC * kVS * 2;
constexpr int kOffS = kOffG + kC * kGS * 4;
constexpr int kOffL = kOffS + kD * kSS * 4;   // L, then V′
constexpr int kOffT = kOffL + kC * kSS * 4;
constexpr int kOffA = kOffT + kC * kLS * 4;
constexpr int kOffW = kOffA + kC * kLS * 4;
constexpr int kOffR = kOffW + kC * kGS * 4;   // rk, rq, β
constexpr int kSmem = kOffR + 3 * kC * 4;

// tf32 operand, rounded to nearest (ties away) by one integer add: the mma reads the top 19 bits. cvt.rna.tf32
// is a conversion (16 per SM per cycle): at 6 per mma it was the kernel's bottleneck.
__device__ __forceinline__ uint32_t tf32(float x) { return __float_as_uint(x) + 0x1000u; }

__device__ __forceinline__ void mma_tf32_raw(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// x = big + small with big the tf32 rounding of x (exact in tf32) and small the tf32 rounding of the rest.
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  small = tf32(x - __uint_as_float(big));
}

// d += a·b. kSplit (the default): three tf32 products (small·big + big·small + big·big, the small·small term
// dropped) give the fp32 product to ~2^-21 of each term, so the chunked form agrees with the fp32 recurrence
// of the CPU reference to fp32 rounding instead of tf32's 2^-11: one tf32 product per pair left the GPU 1 %
// of a logit row from the CPU model in bf16 precision on random checkpoints, and free-running greedy output
// parted within 13 tokens. Without kSplit: one tf32 product (the faster, coarser form, kept for the benchmark).
template <bool kSplit>
__device__ __forceinline__ void mma_tf32(float (&d)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
  if constexpr (kSplit) {
    uint32_t A0, A1, A2, A3, B0, B1, a0s, a1s, a2s, a3s, b0s, b1s;
    split_tf32(a0, A0, a0s), split_tf32(a1, A1, a1s), split_tf32(a2, A2, a2s), split_tf32(a3, A3, a3s);
    split_tf32(b0, B0, b0s), split_tf32(b1, B1, b1s);
    mma_tf32_raw(d, a0s, a1s, a2s, a3s, B0, B1);
    mma_tf32_raw(d, A0, A1, A2, A3, b0s, b1s);
    mma_tf32_raw(d, A0, A1, A2, A3, B0, B1);
  } else {
    mma_tf32_raw(d, tf32(a0), tf32(a1), tf32(a2), tf32(a3), tf32(b0), tf32(b1));
  }
}

__device__ __forceinline__ float bf(const uint16_t* p) { return bf16_bits_to_float(*p); }

struct ChunkArgs {
  const uint16_t* qkv;
  const float* g;
  const float* beta_logits;
  const float* a_log;
  const float* dt_bias;
  float lower_bound;
  char* state;
  int64_t slot_bytes;
  const int32_t* slot_ids;
  const int32_t* cu;
  int heads;
  float* out;
};

template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) kda_chunk_kernel(ChunkArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem + kOffK);
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem + kOffQ);
  uint16_t* sV = reinterpret_cast<uint16_t*>(smem + kOffV);
  float* sG = reinterpret_cast<float*>(smem + kOffG);
  float* sS = reinterpret_cast<float*>(smem + kOffS);
  float* sL = reinterpret_cast<float*>(smem + kOffL);
  float* sVp = sL;
  float* sT = reinterpret_cast<float*>(smem + kOffT);
  float* sA = reinterpret_cast<float*>(smem + kOffA);
  float* sW = reinterpret_cast<float*>(smem + kOffW);
  float* s_rk = reinterpret_cast<float*>(smem + kOffR);
  float* s_rq = s_rk + kC;
  float* s_beta = s_rq + kC;

  const int h = blockIdx.x;
  const int j0 = blockIdx.y * kDv;
  const int b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;
  const int H = a.heads;
  const int64_t row_width = 3LL * H * kD;
  const float a_coef = expf(a.a_log[h]);
  const float rsqrt_dk = rsqrtf(static_cast<float>(kD));
  const float dt_ch = a.dt_bias ? a.dt_bias[static_cast<int64_t>(h) * kD + (threadIdx.x & 127)] : 0.f;

  pdl_wait();
  const int64_t seq_begin = a.cu[b];
  const int64_t len = a.cu[b + 1] - seq_begin;
  float* S_glob = reinterpret_cast<float*>(a.state + static_cast<int64_t>(a.slot_ids[b]) * a.slot_bytes) +
                  static_cast<int64_t>(h) * kD * kD + j0;

  // The state slice [128, 64] into shared memory, then each warp's rows into its accumulators.
  for (int idx = tid; idx < kD * kDv / 4; idx += kThreads) {
    const int i = idx / (kDv / 4), j = (idx % (kDv / 4)) * 4;
    *reinterpret_cast<float4*>(sS + i * kSS + j) = *reinterpret_cast<const float4*>(S_glob + i * kD + j);
  }
  __syncthreads();
  float acc_s[4][4];
  const int si0 = 16 * (warp & 7) + gq, si1 = si0 + 8, sj = 32 * (warp >> 3);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int j = sj + 8 * nt + 2 * tq;
    acc_s[nt][0] = sS[si0 * kSS + j], acc_s[nt][1] = sS[si0 * kSS + j + 1];
    acc_s[nt][2] = sS[si1 * kSS + j], acc_s[nt][3] = sS[si1 * kSS + j + 1];
  }

  const int mt = warp & 3, nq = warp >> 2;  // the W / V′ / O tiles: 16 rows, a quarter of the columns
  const int r0 = 16 * mt + gq, r1 = r0 + 8;

  for (int64_t c0 = 0; c0 < len; c0 += kC) {
    const int n = len - c0 < kC ? static_cast<int>(len - c0) : kC;
    const int64_t rowbase = seq_begin + c0;
    // ---- load the chunk, every copy in flight at once (rows ≥ n: zeros; g = 0 and β = 0 there below).
    for (int idx = tid; idx < kC * 16; idx += kThreads) {
      const int r = idx >> 4, c8 = (idx & 15) * 8;
      const uint16_t* src = a.qkv + (rowbase + (r < n ? r : 0)) * row_width + static_cast<int64_t>(h) * kD + c8;
      cp_async_16(sQ + r * kKS + c8, src, r < n);
      cp_async_16(sK + r * kKS + c8, src + static_cast<int64_t>(H) * kD, r < n);
    }
    for (int idx = tid; idx < kC * 8; idx += kThreads) {
      const int r = idx >> 3, c8 = (idx & 7) * 8;
      cp_async_16(sV + r * kVS + c8,
                  a.qkv + (rowbase + (r < n ? r : 0)) * row_width + 2LL * H * kD + static_cast<int64_t>(h) * kD + j0 + c8,
                  r < n);
    }
    for (int idx = tid; idx < kC * 32; idx += kThreads) {
      const int r = idx >> 5, c4 = (idx & 31) * 4;
      cp_async_16(sG + r * kGS + c4, a.g + (rowbase + (r < n ? r : 0)) * H * kD + static_cast<int64_t>(h) * kD + c4,
                  r < n);
    }
    cp_async_commit();
    if (tid < kC) s_beta[tid] = tid < n ? sigmoidf(a.beta_logits[(rowbase + tid) * H + h]) : 0.f;
    cp_async_wait_all();
    __syncthreads();
    // ---- per-row norms (warps 8..15: rows 8(w − 8) ..); the gate and the cumsum of g (warps 0..7).
#pragma unroll 1
    for (int rr = 0; rr < 8 && warp >= 8; ++rr) {
      const int r = 8 * (warp - 8) + rr;
      float sk = 0.f, sq = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float kv = bf(sK + r * kKS + lane + 32 * i), qv = bf(sQ + r * kKS + lane + 32 * i);
        sk += kv * kv, sq += qv * qv;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
      }
      if (lane == 0) {
        s_rk[r] = rsqrtf(sk + 1e-6f);
        s_rq[r] = rsqrtf(sq + 1e-6f) * rsqrt_dk;
      }
    }
    if (tid < 256) {
      const int ch = tid & 127, half = tid >> 7;
      float run = 0.f;
#pragma unroll 8
      for (int r = 32 * half; r < 32 * half + 32; ++r) {
        if (r < n) run += forget_gate(sG[r * kGS + ch] + dt_ch, a_coef, true, a.lower_bound);
        sG[r * kGS + ch] = run;
      }
    }
    __syncthreads();
    if (tid >= 128 && tid < 256) {
      const int ch = tid & 127;
      const float base = sG[31 * kGS + ch];
      for (int r = 32; r < 64; ++r) sG[r * kGS + ch] += base;
    }
    __syncthreads();

    // ---- A_kk → L = β ⊙ strict lower, A_qk → lower incl. diagonal; 10 blocks (R, C ≤ R), one per warp.
    for (int pi = warp; pi < 10; pi += 16) {
      const int R = pi < 1 ? 0 : pi < 3 ? 1 : pi < 6 ? 2 : 3;
      const int Cb = pi - (R * (R + 1)) / 2;
      const int s = 16 * R;
      const int ra = 16 * R + gq, rb = ra + 8;
      float akk[2][4] = {}, aqk[2][4] = {};
      const float rka = s_rk[ra], rkb = s_rk[rb], rqa = s_rq[ra], rqb = s_rq[rb];
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 8) {
        const int i0 = k0 + tq, i1 = i0 + 4;
        const float gs0 = sG[s * kGS + i0], gs1 = sG[s * kGS + i1];
        const float e00 = __expf(sG[ra * kGS + i0] - gs0), e10 = __expf(sG[rb * kGS + i0] - gs0);
        const float e01 = __expf(sG[ra * kGS + i1] - gs1), e11 = __expf(sG[rb * kGS + i1] - gs1);
        const float ka0 = bf(sK + ra * kKS + i0) * rka * e00, ka1 = bf(sK + rb * kKS + i0) * rkb * e10;
        const float ka2 = bf(sK + ra * kKS + i1) * rka * e01, ka3 = bf(sK + rb * kKS + i1) * rkb * e11;
        const float qa0 = bf(sQ + ra * kKS + i0) * rqa * e00, qa1 = bf(sQ + rb * kKS + i0) * rqb * e10;
        const float qa2 = bf(sQ + ra * kKS + i1) * rqa * e01, qa3 = bf(sQ + rb * kKS + i1) * rqb * e11;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int cc = 16 * Cb + 8 * nt + gq;
          const float rkc = s_rk[cc];
          const float b0 = bf(sK + cc * kKS + i0) * rkc * __expf(gs0 - sG[cc * kGS + i0]);
          const float b1 = bf(sK + cc * kKS + i1) * rkc * __expf(gs1 - sG[cc * kGS + i1]);
          mma_tf32<kSplit>(akk[nt], ka0, ka1, ka2, ka3, b0, b1);
          mma_tf32<kSplit>(aqk[nt], qa0, qa1, qa2, qa3, b0, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? ra : rb;
          const int c = 16 * Cb + 8 * nt + 2 * tq + (e & 1);
          sL[r * kLS + c] = c < r ? s_beta[r] * akk[nt][e] : 0.f;
          sA[r * kLS + c] = c <= r ? aqk[nt][e] : 0.f;
        }
    }
    __syncthreads();

    // ---- T = (I + L)⁻¹: diagonal blocks (warps 0..3, lane = column; each lane reads only its own column of T).
    if (warp < 4 && lane < 16) {
      const int base = 16 * warp;
      for (int r = 0; r < 16; ++r) {
        float t = lane == r ? 1.f : 0.f;
        if (lane < r) {
          for (int c = lane; c < r; ++c) t -= sL[(base + r) * kLS + base + c] * sT[(base + c) * kLS + base + lane];
        }
        sT[(base + r) * kLS + base + lane] = t;
      }
    }
    __syncthreads();
    // Off-diagonal blocks by distance d: T_RC = −T_RR Σ_{K=C}^{R−1} L_RK T_KC.
    for (int d = 1; d < 4; ++d) {
      const int elems = (4 - d) * 256;  // pair q = e >> 8 is the block (d + q, q); element (e >> 4 & 15, e & 15)
      float x[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = tid + kThreads * k;
        if (e < elems) {
          const int q = e >> 8, r = (e >> 4) & 15, j = e & 15, R = d + q;
          float acc = 0.f;
          for (int K = q; K < R; ++K)
#pragma unroll
            for (int c = 0; c < 16; ++c)
              acc += sL[(16 * R + r) * kLS + 16 * K + c] * sT[(16 * K + c) * kLS + 16 * q + j];
          x[k] = acc;
        }
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = tid + kThreads * k;
        if (e < elems) sT[(16 * (d + (e >> 8)) + ((e >> 4) & 15)) * kLS + 16 * (e >> 8) + (e & 15)] = x[k];
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = tid + kThreads * k;
        if (e < elems) {
          const int q = e >> 8, r = (e >> 4) & 15, j = e & 15, R = d + q;
          float acc = 0.f;
#pragma unroll
          for (int c = 0; c < 16; ++c) acc -= sT[(16 * R + r) * kLS + 16 * R + c] * sT[(16 * R + c) * kLS + 16 * q + j];
          x[k] = acc;
        }
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = tid + kThreads * k;
        if (e < elems) sT[(16 * (d + (e >> 8)) + ((e >> 4) & 15)) * kLS + 16 * (e >> 8) + (e & 15)] = x[k];
      }
      __syncthreads();
    }

    // ---- W = T (β K e^G) [64 × 128] (this warp: rows of tile mt, columns 32·nq ..), U = T (β V) in registers.
    const int kend = 16 * (mt + 1);
    {
      float acc_w[4][4] = {};
      for (int k0 = 0; k0 < kend; k0 += 8) {
        const int ca = k0 + tq, cb = ca + 4;
        const float a0 = sT[r0 * kLS + ca], a1 = sT[r1 * kLS + ca], a2 = sT[r0 * kLS + cb], a3 = sT[r1 * kLS + cb];
        const float fa = s_beta[ca] * s_rk[ca], fb = s_beta[cb] * s_rk[cb];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int i = 32 * nq + 8 * nt + gq;
          const float b0 = bf(sK + ca * kKS + i) * fa * __expf(sG[ca * kGS + i]);
          const float b1 = bf(sK + cb * kKS + i) * fb * __expf(sG[cb * kGS + i]);
          mma_tf32<kSplit>(acc_w[nt], a0, a1, a2, a3, b0, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int i = 32 * nq + 8 * nt + 2 * tq;
        sW[r0 * kGS + i] = acc_w[nt][0], sW[r0 * kGS + i + 1] = acc_w[nt][1];
        sW[r1 * kGS + i] = acc_w[nt][2], sW[r1 * kGS + i + 1] = acc_w[nt][3];
      }
    }
    float acc_u[2][4] = {};
    for (int k0 = 0; k0 < kend; k0 += 8) {
      const int ca = k0 + tq, cb = ca + 4;
      const float a0 = sT[r0 * kLS + ca], a1 = sT[r1 * kLS + ca], a2 = sT[r0 * kLS + cb], a3 = sT[r1 * kLS + cb];
      const float fa = s_beta[ca], fb = s_beta[cb];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = 16 * nq + 8 * nt + gq;
        mma_tf32<kSplit>(acc_u[nt], a0, a1, a2, a3, bf(sV + ca * kVS + j) * fa, bf(sV + cb * kVS + j) * fb);
      }
    }
    __syncthreads();
    // V′ = U − W S.
#pragma unroll 4
    for (int k0 = 0; k0 < kD; k0 += 8) {
      const int i0 = k0 + tq, i1 = i0 + 4;
      const float a0 = -sW[r0 * kGS + i0], a1 = -sW[r1 * kGS + i0], a2 = -sW[r0 * kGS + i1], a3 = -sW[r1 * kGS + i1];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = 16 * nq + 8 * nt + gq;
        mma_tf32<kSplit>(acc_u[nt], a0, a1, a2, a3, sS[i0 * kSS + j], sS[i1 * kSS + j]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int j = 16 * nq + 8 * nt + 2 * tq;
      sVp[r0 * kSS + j] = acc_u[nt][0], sVp[r0 * kSS + j + 1] = acc_u[nt][1];
      sVp[r1 * kSS + j] = acc_u[nt][2], sVp[r1 * kSS + j + 1] = acc_u[nt][3];
    }
    __syncthreads();

    // ---- O = (Q e^G) S + A_qk V′.
    {
      float acc_o[2][4] = {};
      const float rq0 = s_rq[r0], rq1 = s_rq[r1];
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 8) {
        const int i0 = k0 + tq, i1 = i0 + 4;
        const float a0 = bf(sQ + r0 * kKS + i0) * rq0 * __expf(sG[r0 * kGS + i0]);
        const float a1 = bf(sQ + r1 * kKS + i0) * rq1 * __expf(sG[r1 * kGS + i0]);
        const float a2 = bf(sQ + r0 * kKS + i1) * rq0 * __expf(sG[r0 * kGS + i1]);
        const float a3 = bf(sQ + r1 * kKS + i1) * rq1 * __expf(sG[r1 * kGS + i1]);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int j = 16 * nq + 8 * nt + gq;
          mma_tf32<kSplit>(acc_o[nt], a0, a1, a2, a3, sS[i0 * kSS + j], sS[i1 * kSS + j]);
        }
      }
      for (int k0 = 0; k0 < kend; k0 += 8) {
        const int ca = k0 + tq, cb = ca + 4;
        const float a0 = sA[r0 * kLS + ca], a1 = sA[r1 * kLS + ca], a2 = sA[r0 * kLS + cb], a3 = sA[r1 * kLS + cb];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int j = 16 * nq + 8 * nt + gq;
          mma_tf32<kSplit>(acc_o[nt], a0, a1, a2, a3, sVp[ca * kSS + j], sVp[cb * kSS + j]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = j0 + 16 * nq + 8 * nt + 2 * tq;
        if (r0 < n)
          *reinterpret_cast<float2*>(a.out + ((rowbase + r0) * H + h) * kD + j) = make_float2(acc_o[nt][0], acc_o[nt][1]);
        if (r1 < n)
          *reinterpret_cast<float2*>(a.out + ((rowbase + r1) * H + h) * kD + j) = make_float2(acc_o[nt][2], acc_o[nt][3]);
      }
    }
    __syncthreads();

    // ---- S ← e^{G_last} S + (K e^{G_last − G})ᵀ V′ (warp: key rows si0, si1).
    {
      const float gl0 = sG[(kC - 1) * kGS + si0], gl1 = sG[(kC - 1) * kGS + si1];
      const float d0 = __expf(gl0), d1 = __expf(gl1);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) acc_s[nt][0] *= d0, acc_s[nt][1] *= d0, acc_s[nt][2] *= d1, acc_s[nt][3] *= d1;
#pragma unroll 2
      for (int k0 = 0; k0 < kC; k0 += 8) {
        const int ca = k0 + tq, cb = ca + 4;
        const float rka = s_rk[ca], rkb = s_rk[cb];
        const float a0 = bf(sK + ca * kKS + si0) * rka * __expf(gl0 - sG[ca * kGS + si0]);
        const float a1 = bf(sK + ca * kKS + si1) * rka * __expf(gl1 - sG[ca * kGS + si1]);
        const float a2 = bf(sK + cb * kKS + si0) * rkb * __expf(gl0 - sG[cb * kGS + si0]);
        const float a3 = bf(sK + cb * kKS + si1) * rkb * __expf(gl1 - sG[cb * kGS + si1]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int j = sj + 8 * nt + gq;
          mma_tf32<kSplit>(acc_s[nt], a0, a1, a2, a3, sVp[ca * kSS + j], sVp[cb * kSS + j]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int j = sj + 8 * nt + 2 * tq;
        sS[si0 * kSS + j] = acc_s[nt][0], sS[si0 * kSS + j + 1] = acc_s[nt][1];
        sS[si1 * kSS + j] = acc_s[nt][2], sS[si1 * kSS + j + 1] = acc_s[nt][3];
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int j = sj + 8 * nt + 2 * tq;
    *reinterpret_cast<float2*>(S_glob + si0 * kD + j) = make_float2(acc_s[nt][0], acc_s[nt][1]);
    *reinterpret_cast<float2*>(S_glob + si1 * kD + j) = make_float2(acc_s[nt][2], acc_s[nt][3]);
  }
  pdl_launch_dependents();
}

// ---------------------------------------------------------------------------------------------------------------
// RMSNormGated: one warp per (token, head).

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads) gated_rmsnorm_kernel(const float* __restrict__ o,
                                                                     const float* __restrict__ gate,
                                                                     const float* __restrict__ weight, int64_t rows,
                                                                     float eps, float* __restrict__ y,
                                                                     uint16_t* __restrict__ y_bf16) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kNormThreads / 32) + (threadIdx.x >> 5);
  const float4 w = *reinterpret_cast<const float4*>(weight + 4 * lane);
  pdl_wait();
  pdl_launch_dependents();
  if (row >= rows) return;
  const float4 v = *reinterpret_cast<const float4*>(o + row * kD + 4 * lane);
  const float4 gt = *reinterpret_cast<const float4*>(gate + row * kD + 4 * lane);
  float ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float r = rsqrtf(ss / kD + eps);
  const float4 out = make_float4(w.x * v.x * r * sigmoidf(gt.x), w.y * v.y * r * sigmoidf(gt.y),
                                 w.z * v.z * r * sigmoidf(gt.z), w.w * v.w * r * sigmoidf(gt.w));
  if (y) *reinterpret_cast<float4*>(y + row * kD + 4 * lane) = out;
  if (y_bf16) {
    const uint2 packed = make_uint2(
        static_cast<uint32_t>(float_to_bf16_bits(out.x)) | (static_cast<uint32_t>(float_to_bf16_bits(out.y)) << 16),
        static_cast<uint32_t>(float_to_bf16_bits(out.z)) | (static_cast<uint32_t>(float_to_bf16_bits(out.w)) << 16));
    *reinterpret_cast<uint2*>(y_bf16 + row * kD + 4 * lane) = packed;
  }
}

}  // namespace

Status kda_conv_prefill(const uint16_t* qkv, const float* conv_weight, const int32_t* cu_seqlens, int64_t num_seqs,
                        int64_t total_tokens, int64_t heads, const KdaStateSlots& slots, uint16_t* out,
                        StreamHandle stream) {
  const char* name = "cuda::kda_conv_prefill";
  if (heads <= 0 || num_seqs < 0 || total_tokens < 0 || !qkv || !conv_weight || !cu_seqlens || !out)
    return invalid_argument(std::string(name) + ": bad shape or missing pointer");
  KILN_RETURN_IF_ERROR(kda_check_slots(slots, heads, name));
  if (reinterpret_cast<uintptr_t>(conv_weight) % 16 != 0)
    return invalid_argument(std::string(name) + ": conv_weight must be 16-byte aligned");
  if (num_seqs == 0) return ok_status();
  const int64_t channels = 3 * heads * kD;
  const int64_t state_offset = heads * kD * kD * 4;
  const unsigned cblocks = blocks_for(channels, kConvThreads);
  if (total_tokens > 0)
    KILN_RETURN_IF_ERROR(check_cuda(
        launch_pdl(conv_out_kernel, dim3(cblocks, blocks_for(total_tokens, kConvTile)), dim3(kConvThreads), 0, stream,
                   qkv, conv_weight, cu_seqlens, static_cast<int>(num_seqs), total_tokens, channels,
                   static_cast<const char*>(slots.state), slots.slot_bytes, slots.slot_ids, state_offset, out),
        name));
  return check_cuda(launch_pdl(conv_state_kernel, dim3(cblocks, static_cast<unsigned>(num_seqs)), dim3(kConvThreads), 0,
                               stream, qkv, cu_seqlens, channels, slots.state, slots.slot_bytes, slots.slot_ids,
                               state_offset),
                    name);
}

bool kda_prefill_uses_chunked(const KdaGate& gate) {
  return gate.has_lower_bound && gate.lower_bound < 0.f && gate.lower_bound >= -5.5f;
}

Status kda_prefill(const KdaPrefillParams& p, StreamHandle stream) {
  const char* name = "cuda::kda_prefill";
  if (p.heads <= 0 || p.num_seqs < 0 || !p.qkv || !p.g || !p.beta_logits || !p.forget.a_log || !p.cu_seqlens || !p.out)
    return invalid_argument(std::string(name) + ": bad shape or missing pointer");
  KILN_RETURN_IF_ERROR(kda_check_slots(p.slots, p.heads, name));
  if (reinterpret_cast<uintptr_t>(p.qkv) % 16 != 0 || reinterpret_cast<uintptr_t>(p.g) % 16 != 0 ||
      (p.forget.dt_bias && reinterpret_cast<uintptr_t>(p.forget.dt_bias) % 16 != 0))
    return invalid_argument(std::string(name) + ": qkv, g and dt_bias must be 16-byte aligned");
  if (p.num_seqs == 0) return ok_status();
  if (!kda_prefill_uses_chunked(p.forget)) return kda_recurrent_fallback(p, stream);
  static const cudaError_t attr =
      cudaFuncSetAttribute(kda_chunk_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  static const cudaError_t attr_tf32 =
      cudaFuncSetAttribute(kda_chunk_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  KILN_RETURN_IF_ERROR(check_cuda(p.split_tf32 ? attr : attr_tf32, name));
  const ChunkArgs a{p.qkv, p.g, p.beta_logits, p.forget.a_log, p.forget.dt_bias, p.forget.lower_bound,
                    p.slots.state, p.slots.slot_bytes, p.slots.slot_ids, p.cu_seqlens, static_cast<int>(p.heads), p.out};
  const dim3 grid(static_cast<unsigned>(p.heads), kD / kDv, static_cast<unsigned>(p.num_seqs));
  return check_cuda(p.split_tf32 ? launch_pdl(kda_chunk_kernel<true>, grid, dim3(kThreads), kSmem, stream, a)
                                  : launch_pdl(kda_chunk_kernel<false>, grid, dim3(kThreads), kSmem, stream, a),
                    name);
}

Status kda_gated_rmsnorm(const float* o, const float* gate, const float* weight, int64_t n, int64_t heads, float eps,
                         float* y, uint16_t* y_bf16, StreamHandle stream) {
  if (n < 0 || heads <= 0 || !o || !gate || !weight || (!y && !y_bf16))
    return invalid_argument("cuda::kda_gated_rmsnorm: bad shape or missing pointer");
  for (const void* q : {static_cast<const void*>(o), static_cast<const void*>(gate), static_cast<const void*>(weight),
                        static_cast<const void*>(y)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0)
      return invalid_argument("cuda::kda_gated_rmsnorm: o, gate, weight and y must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(y_bf16) % 8 != 0)
    return invalid_argument("cuda::kda_gated_rmsnorm: y_bf16 must be 8-byte aligned");
  const int64_t rows = n * heads;
  if (rows == 0) return ok_status();
  return check_cuda(launch_pdl(gated_rmsnorm_kernel, dim3(blocks_for(rows, kNormThreads / 32)), dim3(kNormThreads), 0,
                               stream, o, gate, weight, rows, eps, y, y_bf16),
                    "cuda::kda_gated_rmsnorm");
}

}  // namespace kiln::cuda

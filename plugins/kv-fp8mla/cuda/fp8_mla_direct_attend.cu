// fp8_ds_mla decode attention that multiplies the fp8 rows where they land (sm_90+), for dense pages (no DSA
// selection) of 8, 16, 32 or a multiple of 64 slots. Same plan, splits, workspace, merge and output as the SDK's
// tensor-core attention (kiln/cuda/mla_decode_tc.cuh: `cta_work` cuts the grid, `finish_splits` ends a CTA); what
// differs is the tile loop.
// Arithmetic. e4m3 → f16 is exact (one cvt per two values), so the latent products are fp16 mma with q in fp16 (in
// registers), scaled per (pair, warp) by a power of two into range (|q · 2^−e| < 2^15); each key's per-128 scale
// and 2^e multiply the fp32 score partial, then the bf16 rope part is added with a bf16 mma. The k order inside a
// scale tile is permuted (both operands alike) so that one 8-byte load feeds two k16 steps without bank conflicts.
// For the values the per-(key, T) scale goes into the attention weights: P_T = e · scale / U in fp16, one copy of P
// per scale tile T, with U a power of two per (pair, T) ≥ the largest weight e · scale of the tile and ≥ the carried
// unit (so P_T ≤ 1, and a key whose scale is huge but whose weight is ~0 does not push the others' weights below
// fp16's range); the accumulators are rescaled by alpha · U_old / U_new (skipped when every factor is 1), and the
// output multiplied by U at the end. Vᵀ's fragments are built from four 4-byte row loads per k16 step,
// byte-interleaved (prmt) into e4m3 pairs of adjacent keys; the output dims are permuted among a warp's lanes so
// those loads are contiguous (undone when the output is staged).
// Accuracy: the rows are used exactly (e4m3 · scale, no bf16 rounding of widened values); q is rounded to fp16 (11
// significant bits, against bf16's 8) and the weights to fp16 — 5–10× closer to the host's fp32 attention than the
// widened form (Fp8MlaDirectAttention.*).
// Schedule. The CTA's 16 warps work in two roles on different tiles at once: warps 0–7 compute tile t + 1's scores
// and softmax while warps 8–15 turn tile t's exponentials into weights and multiply them into the output. (The
// first direct kernel ran every warp through a tile's three phases in turn with CTA barriers between them: 3.1 µs a
// 64-key tile on an H100 against 1.8 µs for its bytes, most scheduler cycles without a ready warp; this one is 8 %
// faster at 128K alone and 3 % in the whole model — bench/RESULTS.md, bench/NOTES-cuda.md.)
// - Score warps: warp w takes keys 32·(w % 2) .. + 31 over scale tile T = w / 2 (128 dims, plus rope dims
//   16T .. 16T + 15): four partials a key, summed in a fixed order by the online softmax (8 threads a pair, 8 keys
//   each), which writes the tile's exponentials e, each pair's alpha and the keys' scales into one of two buffers
//   and signals the value warps on a named barrier (bar.arrive: no waiting).
// - Value warps: warp v owns latent dims 64v .. 64v + 63 (scale tile T = v / 2). The two warps of a scale tile turn
//   e into its weights P_T = e · scale / U (each for half of the pairs, keeping those pairs' units; then a barrier
//   of the two), release the buffer to the score warps, multiply, and once all eight are done with the stage one of
//   them copies the tile three ahead into it. (With the units on the score warps, the score warps were the whole
//   critical path and the value warps waited half the time: no faster than the serial form.)
// - A tile of 64 keys arrives as one to eight bulk copies of whole page runs (the rows are contiguous in a page),
//   three stages on mbarriers — no per-row copy instructions. Rows past the CTA's last key are zeroed in shared
//   memory before use (stale slots may hold any bytes, NaN included).
// Shared memory is kept to ~180 KB: in the decode step the neighbouring kernels' CTAs must fit beside this one's
// for programmatic dependent launch to overlap them (a 208 KB version that double-buffered the partial scores was
// 3 % slower in the whole model at 32K and 128K, no slower alone).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fp8_mla_direct_attend.h"
#include "fp8_mla_kernels.h"
#include "kiln/cuda/mbarrier.cuh"
#include "kiln/cuda/mla_decode_tc.cuh"

namespace kiln::fp8mla {
namespace {

constexpr int kKeys = static_cast<int>(cuda::kMlaDecodeTile);  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

// A cached row as it lands in shared memory: 512 e4m3, 4 fp32 scales, kRope bf16 rope values, 16-byte padded.
template <int kRope>
struct Geo {
  static constexpr int kLatent = static_cast<int>(cuda::kMlaLatentDim);
  static constexpr int kScalesAt = kLatent;        // 4 fp32 scales
  static constexpr int kRopeAt = kLatent + 16;     // bf16 rope values
  static constexpr int kRowBytes = (kRopeAt + 2 * kRope + 15) / 16 * 16;  // 656 / 528 (fp8_mla_row.h)
  static constexpr int kRow = kLatent + kRope;     // q's row
  static constexpr int kStageBytes = kKeys * kRowBytes;
  static_assert(kRowBytes % 16 == 0, "bulk copies move 16-byte multiples");
};

// The four e4m3 values of a 32-bit word as two f16x2 registers: bytes 0, 1 → lo; bytes 2, 3 → hi.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t four_bytes, uint32_t& lo, uint32_t& hi) {
  asm("{\n"
      ".reg .b16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(four_bytes));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The smallest power of two ≥ x for x ≥ 0 finite (0 stays 0, a subnormal gives FLT_MIN), branch-free: adding a
// mantissa's worth carries into the exponent unless the mantissa is zero.
__device__ __forceinline__ float pow2_ceil(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x007fffffu) & 0x7f800000u);
}

// 1 / u for u a power of two in [FLT_MIN, 2^126], exactly, without a division (its slow path is a call).
__device__ __forceinline__ float pow2_inverse(float u) { return __uint_as_float(0x7f000000u - __float_as_uint(u)); }

constexpr int kThreads = 512;
constexpr int kRoleThreads = 256;         // eight warps a role
constexpr int kProducer = kThreads - 1;   // a value warp's thread issues the copies
constexpr int kStages = 3;
constexpr int kScaleTiles = 4;            // the latent's 128-value scale tiles: one score partial each
constexpr int kPartStride = kKeys + 4;    // fp32 partial scores [scale tile][pair][key]
constexpr int kPStride = kKeys + 8;       // fp16 weights [scale tile][pair][key]
constexpr int kEStride = kKeys + 4;       // fp32 exponentials [pair][key]
constexpr int kOutStride = static_cast<int>(cuda::kMlaLatentDim) + 4;
constexpr int kSoftmaxThreads = 8;        // per pair, 8 keys each: 8·kN pairs fill 64·kN ≤ 256 score threads
constexpr int kMaxPieces = 8;             // bulk copies a tile (pages of 8 slots)
// Hardware barriers (0 is __syncthreads').
constexpr int kBarScores = 1;             // the score warps among themselves
constexpr int kBarValues = 2;             // the value warps among themselves
constexpr int kBarFull = 3;               // + buffer: its tile's e, alpha and key scales are written (score → value)
constexpr int kBarEmpty = 5;              // + buffer: the value warps are done with it (value → score warps)
constexpr int kBarScaleTile = 7;          // + T: the two value warps of scale tile T

template <int kN, int kRope>
struct Smem {
  static constexpr int kPairs = 8 * kN;
  static constexpr size_t kPartBytes = sizeof(float) * kScaleTiles * kPairs * kPartStride;
  static constexpr size_t kPBytes = sizeof(uint16_t) * kScaleTiles * kPairs * kPStride;
  static constexpr size_t kEBytes = sizeof(float) * kPairs * kEStride;
  static constexpr size_t kPart = size_t{kStages} * Geo<kRope>::kStageBytes;
  static constexpr size_t kScales = kPart + kPartBytes;                                  // fp32 [2][T][key]
  static constexpr size_t kE = kScales + 2 * sizeof(float) * kScaleTiles * kKeys;        // fp32 [2][pair][key]
  static constexpr size_t kP = kE + 2 * kEBytes;                                         // fp16 [T][pair][key]
  static constexpr size_t kFac = kP + kPBytes;                                           // fp32 [T][pair]
  static constexpr size_t kAlpha = kFac + sizeof(float) * kScaleTiles * kPairs;          // fp32 [2][pair]
  static constexpr size_t kStats = kAlpha + 2 * sizeof(float) * kPairs;                  // l, m, unit [T] per pair
  static constexpr size_t kIds = kStats + sizeof(float) * (2 + kScaleTiles) * kPairs;   // the producer's page ids
  static constexpr size_t kBars = (kIds + 4 * kMaxPieces + 7) / 8 * 8;
  static constexpr size_t kBytes = kBars + sizeof(uint64_t) * kStages;
  static_assert(kPart % 16 == 0 && kPartBytes % 16 == 0 && kE % 16 == 0 && kEBytes % 16 == 0 && kP % 16 == 0,
                "16-byte loads, stores and ldmatrix rows");
  static_assert(sizeof(float) * kPairs * kOutStride <= kPart, "the output staging fits in the stages");
};

template <int kN, int kRope, bool kMerge>
__global__ void __launch_bounds__(kThreads, 1) fp8_mla_direct_kernel(cuda::MlaDecodeParams p, float* part_out,
                                                                        float* part_lse, unsigned* sync) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using G = Geo<kRope>;
  using L = Smem<kN, kRope>;
  constexpr int kPairs = L::kPairs;
  constexpr int kRowBytes = G::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem[];
  float* s_part = reinterpret_cast<float*>(smem + L::kPart);
  float* s_scale = reinterpret_cast<float*>(smem + L::kScales);  // [buffer][T][key]: scales, score → value warps
  float* s_e = reinterpret_cast<float*>(smem + L::kE);      // [buffer][pair][key]: 2^(s − m), masked keys 0
  uint16_t* s_p = reinterpret_cast<uint16_t*>(smem + L::kP);
  float* s_fac = reinterpret_cast<float*>(smem + L::kFac);  // [T][pair]: alpha · U_old / U_new
  float* s_alpha = reinterpret_cast<float*>(smem + L::kAlpha);  // [buffer][pair]: 2^(m_old − m_new)
  float* s_l = reinterpret_cast<float*>(smem + L::kStats);
  float* s_m = s_l + kPairs;
  float* s_unit = s_m + kPairs;  // [T][pair]: U after the last tile
  int32_t* next_ids = reinterpret_cast<int32_t*>(smem + L::kIds);
  const uint32_t stage0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + L::kBars));

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma group id
  const int c = lane % 4;  // thread in group
  const int split = blockIdx.y;
  if (tid == kProducer) {
    for (int s = 0; s < kStages; ++s) cuda::mbarrier_init(bar0 + 8 * s, 1);
    cuda::mbarrier_init_fence();
  }
  // q, kv_len, the tables and the newest cache row come from the kernels just before this one.
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  const cuda::mla_tc::CtaWork work = cuda::mla_tc::cta_work(p, kPairs);
  if (!work.active) return;  // whole CTA: before any barrier
  const int64_t first_row = work.first_row;
  const int heads = static_cast<int>(p.num_heads);
  const int m0 = work.m0, n_pairs = work.n_pairs;
  const int64_t pair_base = work.pair_base;
  const int32_t* block_table = work.block_table;
  const int64_t n_keys = work.n_keys;
  const int64_t tile_begin = work.tile_begin, tile_end = work.tile_end;
  const int n_tiles = static_cast<int>(max(int64_t{0}, tile_end - tile_begin));

  // The producer (a value warp's thread): a tile is `pieces` runs of `piece_rows` contiguous rows (one page, or a
  // 64-slot piece of a larger page); runs wholly past the last key are not copied. The page ids of the next tile are
  // read one copy ahead into shared memory, so a copy never waits for its block-table load; 32-bit page arithmetic
  // (a 64-bit division here once stalled every warp at the next barrier).
  const int bs = static_cast<int>(p.block_size);
  const int pieces = bs >= kKeys ? 1 : kKeys / bs;
  const int piece_rows = kKeys / pieces;
  const int tiles_per_page = bs >= kKeys ? bs / kKeys : 1;
  const int keys = static_cast<int>(n_keys);
  auto load_ids = [&](int tile) {
    if (tile >= tile_end) return;
    if (bs >= kKeys) {
      next_ids[0] = block_table[tile / tiles_per_page];
      return;
    }
    for (int i = 0; i < pieces && tile * kKeys + i * piece_rows < keys; ++i) next_ids[i] = block_table[tile * pieces + i];
  };
  auto issue = [&](int tile) {
    const int stage = (tile - static_cast<int>(tile_begin)) % kStages;
    const int key0 = tile * kKeys;
    const int live = min(pieces, (keys - key0 + piece_rows - 1) / piece_rows);
    const uint32_t bar = bar0 + 8 * stage;
    cuda::mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(live * piece_rows * kRowBytes));
    const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
    const int page_row = bs >= kKeys ? (tile % tiles_per_page) * kKeys : 0;  // the tile's first slot in its page
    for (int i = 0; i < live; ++i) {
      const int64_t slot = static_cast<int64_t>(next_ids[i]) * bs + page_row;
      cuda::bulk_copy_g2s(stage0 + stage * G::kStageBytes + i * piece_rows * kRowBytes, cache + slot * kRowBytes,
                          static_cast<uint32_t>(piece_rows * kRowBytes), bar);
    }
    load_ids(tile + 1);
  };
  __syncthreads();  // the barriers are initialised
  if (tid == kProducer) {
    load_ids(static_cast<int>(tile_begin));
    for (int64_t t = tile_begin; t < min(tile_end, tile_begin + kStages); ++t) issue(static_cast<int>(t));
  }

  if (warp < 8) {
    // ---- Score warps. This warp's share of q: key half kh of scale tile grp, lane c's 8-byte pieces o_c + 16m
    // (m = 0..3) of the tile, and rope dims 16·grp onward.
    const int kh = warp % 2, grp = warp / 2;
    const int o_c = (c & 1) * 8 + (c >> 1) * 64;  // byte offset of lane c's 8-byte pieces in a 128-value tile
    uint32_t qf[8][kN][2];                        // latent k16 steps, fp16, 2^−e scaled
    uint32_t qr[kN][2];                           // the rope k16 step, bf16
    float pe[kN][2];                              // 2^e of accumulator columns 8nt + 2c, 8nt + 2c + 1
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      const int pair = nt * 8 + g;
      const bool valid = pair < n_pairs;
      const float* src = p.q + (pair_base + (valid ? pair : 0)) * G::kRow;
      float v[4][8];
      float amax = 0.f;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float4 lo = *reinterpret_cast<const float4*>(src + grp * 128 + o_c + 16 * m);
        const float4 hi = *reinterpret_cast<const float4*>(src + grp * 128 + o_c + 16 * m + 4);
        v[m][0] = lo.x, v[m][1] = lo.y, v[m][2] = lo.z, v[m][3] = lo.w;
        v[m][4] = hi.x, v[m][5] = hi.y, v[m][6] = hi.z, v[m][7] = hi.w;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (!valid) v[m][j] = 0.f;
          amax = fmaxf(amax, fabsf(v[m][j]));
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, 2));
      int e = 0;
      if (amax > 0.f && amax <= 3.0e38f) {
        int ex = 0;
        frexpf(amax, &ex);  // amax < 2^ex
        e = max(-100, min(100, ex - 15));
      }
      const float down = ldexpf(1.f, -e);
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          qf[2 * m + h][nt][0] = pack_f16x2(v[m][4 * h] * down, v[m][4 * h + 1] * down);
          qf[2 * m + h][nt][1] = pack_f16x2(v[m][4 * h + 2] * down, v[m][4 * h + 3] * down);
        }
      const float up = ldexpf(1.f, e);
      pe[nt][0] = __shfl_sync(~0u, up, (2 * c) * 4);
      pe[nt][1] = __shfl_sync(~0u, up, (2 * c + 1) * 4);
      if constexpr (kRope > 0) {
        const float* r = src + G::kLatent + 16 * grp + 2 * c;
        qr[nt][0] = valid ? cuda::pack_bf16x2(r[0], r[1]) : 0u;
        qr[nt][1] = valid ? cuda::pack_bf16x2(r[8], r[9]) : 0u;
      }
    }

    // Softmax: threads 8i .. 8i+7 own pair i (keys 8j .. 8j+7 of each tile for thread 8i + j); a warp's threads
    // are all active or all not (8·kN pairs).
    const int sm_pair = tid / kSoftmaxThreads, sm_part = tid % kSoftmaxThreads;
    const bool sm_active = sm_pair < kPairs;
    const int64_t sm_keys = sm_pair >= n_pairs ? 0 : p.kv_len[first_row + (m0 + sm_pair) / heads];
    float sm_m = -INFINITY, sm_l = 0.f;
    const float score_scale = p.scale * kLog2e;  // softmax in base 2

    for (int i = 0; i < n_tiles; ++i) {
      const int64_t tile = tile_begin + i;
      const int stage = i % kStages, buf = i & 1;
      const unsigned char* st = smem + static_cast<size_t>(stage) * G::kStageBytes;
      cuda::mbarrier_wait(bar0 + 8 * stage, static_cast<uint32_t>((i / kStages) & 1));
      const int valid_rows = static_cast<int>(min(static_cast<int64_t>(kKeys), n_keys - tile * kKeys));
      if (valid_rows < kKeys) {  // the last tile: rows past the last key are zeros, whatever their slots held
        uint4* z = reinterpret_cast<uint4*>(smem + static_cast<size_t>(stage) * G::kStageBytes + valid_rows * kRowBytes);
        const int n16 = (kKeys - valid_rows) * kRowBytes / 16;
        for (int k = tid; k < n16; k += kRoleThreads) z[k] = make_uint4(0u, 0u, 0u, 0u);
        cuda::fence_proxy_async_shared();
        cuda::named_barrier_sync(kBarScores, kRoleThreads);
      }

      // Partial scores S[key, pair] over this warp's keys and scale tile.
      float acc[2][kN][4];
      float ks[2][2];  // the scales of rows g, g + 8 of each m16 tile, for the value warps
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[mt][nt][k] = 0.f;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const unsigned char* r0 = st + (kh * 32 + mt * 16 + g) * kRowBytes;
        const unsigned char* r1 = r0 + 8 * kRowBytes;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const uint2 x = *reinterpret_cast<const uint2*>(r0 + grp * 128 + o_c + 16 * m);
          const uint2 y = *reinterpret_cast<const uint2*>(r1 + grp * 128 + o_c + 16 * m);
          uint32_t a0[4], a1[4];
          e4m3x4_to_f16x2x2(x.x, a0[0], a0[2]);
          e4m3x4_to_f16x2x2(y.x, a0[1], a0[3]);
          e4m3x4_to_f16x2x2(x.y, a1[0], a1[2]);
          e4m3x4_to_f16x2x2(y.y, a1[1], a1[3]);
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) {
            cuda::mma_f16_16816(acc[mt][nt], a0, qf[2 * m][nt][0], qf[2 * m][nt][1]);
            cuda::mma_f16_16816(acc[mt][nt], a1, qf[2 * m + 1][nt][0], qf[2 * m + 1][nt][1]);
          }
        }
        const float ks0 = *reinterpret_cast<const float*>(r0 + G::kScalesAt + 4 * grp);
        const float ks1 = *reinterpret_cast<const float*>(r1 + G::kScalesAt + 4 * grp);
        ks[mt][0] = ks0, ks[mt][1] = ks1;
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) {
          acc[mt][nt][0] *= ks0 * pe[nt][0];
          acc[mt][nt][1] *= ks0 * pe[nt][1];
          acc[mt][nt][2] *= ks1 * pe[nt][0];
          acc[mt][nt][3] *= ks1 * pe[nt][1];
        }
        if constexpr (kRope > 0) {
          const unsigned char* q0 = r0 + G::kRopeAt + 32 * grp + 4 * c;
          const unsigned char* q1 = r1 + G::kRopeAt + 32 * grp + 4 * c;
          const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(q0), *reinterpret_cast<const uint32_t*>(q1),
                                 *reinterpret_cast<const uint32_t*>(q0 + 16), *reinterpret_cast<const uint32_t*>(q1 + 16)};
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) cuda::mma_bf16_16816(acc[mt][nt], a, qr[nt][0], qr[nt][1]);
        }
      }
      // One partial buffer: every score thread has read the previous tile's partials before they are overwritten.
      if (i > 0) cuda::named_barrier_sync(kBarScores, kRoleThreads);
      cuda::mla_tc::store_score_partials<kN, kPartStride>(s_part + grp * kPairs * kPartStride, acc, kh * 32, g, c);
      cuda::named_barrier_sync(kBarScores, kRoleThreads);  // the tile's partial scores are complete

      // Online softmax over the tile (the four partials summed in a fixed order); e, alpha and the key scales go to
      // buffer `buf` once the value warps are done with its tile i − 2.
      float e[8];
      float alpha = 1.f;
      if (sm_active) {
        float s[8];
        {
          const float* src = s_part + sm_pair * kPartStride + sm_part * 8;
          const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
          s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w, s[4] = b.x, s[5] = b.y, s[6] = b.z, s[7] = b.w;
#pragma unroll
          for (int q = 1; q < kScaleTiles; ++q) {
            const float* qs = src + q * kPairs * kPartStride;
            const float4 x = *reinterpret_cast<const float4*>(qs), y = *reinterpret_cast<const float4*>(qs + 4);
            s[0] += x.x, s[1] += x.y, s[2] += x.z, s[3] += x.w, s[4] += y.x, s[5] += y.y, s[6] += y.z, s[7] += y.w;
          }
        }
        const int64_t limit64 = sm_keys - (tile * kKeys + sm_part * 8);  // keys j < limit are visible to the pair
        const int limit = limit64 < 0 ? 0 : limit64 > 8 ? 8 : static_cast<int>(limit64);
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j] = j < limit ? s[j] * score_scale : -INFINITY;
        alpha = cuda::mla_tc::online_softmax_step<8, kSoftmaxThreads>(s, e, sm_m, sm_l);
      }
      if (i >= 2) cuda::named_barrier_sync(kBarEmpty + buf, kThreads);
      if (sm_active) {
        float* e_dst = s_e + buf * (L::kEBytes / sizeof(float)) + sm_pair * kEStride + sm_part * 8;
        *reinterpret_cast<float4*>(e_dst) = make_float4(e[0], e[1], e[2], e[3]);
        *reinterpret_cast<float4*>(e_dst + 4) = make_float4(e[4], e[5], e[6], e[7]);
        if (sm_part == 0) s_alpha[buf * kPairs + sm_pair] = alpha;
      }
      if (c == 0) {  // one writer a row: the value warps' row-strided reads would meet in one bank
        float* sc = s_scale + buf * kScaleTiles * kKeys + grp * kKeys + kh * 32 + g;
        sc[0] = ks[0][0], sc[8] = ks[0][1], sc[16] = ks[1][0], sc[24] = ks[1][1];
      }
      cuda::named_barrier_arrive(kBarFull + buf, kThreads);
    }
    if (sm_active && sm_part == 0) {
      s_l[sm_pair] = sm_l;
      s_m[sm_pair] = sm_m;
    }
  }

  // ---- Value warps: O[dim, pair] += V[key, dim]ᵀ · P_T[pair, key]ᵀ over this warp's 64 dims (scale tile vw / 2),
  // as two 32-dim blocks (byte j of a block's 4-byte row piece at lane group g is dim 4g + j).
  const int vw = warp - 8, vt = vw / 2;
  float acc_o[2][2][kN][4];  // [block][mt]: dims 64vw + 32·block + 4g + 2mt (rows g) and + 1 (rows g + 8) × pairs
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc_o[b][mt][nt][k] = 0.f;
  float unit[kN];  // U of scale tile vt for pairs (vw % 2)·4kN + 4r + lane / 8, r = 0 .. kN − 1
#pragma unroll
  for (int r = 0; r < kN; ++r) unit[r] = 0.f;
  if (warp >= 8) {
    for (int i = 0; i < n_tiles; ++i) {
      const int64_t tile = tile_begin + i;
      const int stage = i % kStages, buf = i & 1;
      const unsigned char* st = smem + static_cast<size_t>(stage) * G::kStageBytes;
      cuda::named_barrier_sync(kBarFull + buf, kThreads);  // the tile's e, alpha and key scales are written
      // The weights of scale tile vt for this warp's half of the pairs (lanes 8j .. 8j + 7: pair 4r + j of the
      // half in round r, keys 8·(lane % 8) onward): P_T = e · scale / U with U a power of two ≥ the largest weight
      // and ≥ the carried unit, so every weight is ≤ 1 and a key with a huge scale but ~0 weight cannot push the
      // others below fp16's range; the factor alpha · U_old / U_new rescales the accumulators.
      {
        const float* e_buf = s_e + buf * (L::kEBytes / sizeof(float));
        const float* sc = s_scale + buf * kScaleTiles * kKeys + vt * kKeys + (lane % 8) * 8;
        const float4 sa = *reinterpret_cast<const float4*>(sc), sb = *reinterpret_cast<const float4*>(sc + 4);
#pragma unroll
        for (int r = 0; r < kN; ++r) {
          const int pair = (vw % 2) * 4 * kN + 4 * r + lane / 8;
          const float* ep = e_buf + pair * kEStride + (lane % 8) * 8;
          const float4 ea = *reinterpret_cast<const float4*>(ep), eb = *reinterpret_cast<const float4*>(ep + 4);
          const float alpha = s_alpha[buf * kPairs + pair];
          const float w[8] = {ea.x * sa.x, ea.y * sa.y, ea.z * sa.z, ea.w * sa.w,
                              eb.x * sb.x, eb.y * sb.y, eb.z * sb.z, eb.w * sb.w};
          float wmax = fmaxf(fmaxf(fmaxf(w[0], w[1]), fmaxf(w[2], w[3])), fmaxf(fmaxf(w[4], w[5]), fmaxf(w[6], w[7])));
#pragma unroll
          for (int off = 4; off > 0; off /= 2) wmax = fmaxf(wmax, __shfl_xor_sync(~0u, wmax, off));
          const float carried = unit[r] * alpha;
          const float u = fmaxf(pow2_ceil(wmax), pow2_ceil(carried));
          unit[r] = u;
          const float inv_u = pow2_inverse(u);  // (2^127 for u = 0, when every w and carried are 0)
          *reinterpret_cast<uint4*>(s_p + (vt * kPairs + pair) * kPStride + (lane % 8) * 8) =
              make_uint4(pack_f16x2(w[0] * inv_u, w[1] * inv_u), pack_f16x2(w[2] * inv_u, w[3] * inv_u),
                         pack_f16x2(w[4] * inv_u, w[5] * inv_u), pack_f16x2(w[6] * inv_u, w[7] * inv_u));
          if (lane % 8 == 0) s_fac[vt * kPairs + pair] = u > 0.f ? carried * inv_u : 1.f;  // ≤ 1
        }
      }
      if (i + 2 < n_tiles) cuda::named_barrier_arrive(kBarEmpty + buf, kThreads);  // the score warps' tile i + 2
      cuda::named_barrier_sync(kBarScaleTile + vt, 64);  // both halves of P_T and its factors are written
      // The stage's bytes, acquired by this thread too (its phase is the tile's: the next copy into this stage is
      // issued only after this tile).
      cuda::mbarrier_wait(bar0 + 8 * stage, static_cast<uint32_t>((i / kStages) & 1));
      const float* fac_src = s_fac + vt * kPairs;
      float fac[kN][2];
      bool unchanged = true;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        fac[nt][0] = fac_src[nt * 8 + 2 * c], fac[nt][1] = fac_src[nt * 8 + 2 * c + 1];
        unchanged = unchanged && fac[nt][0] == 1.f && fac[nt][1] == 1.f;
      }
      // Once a row's max and units settle, most tiles leave every factor at exactly 1.
      if (!__all_sync(~0u, unchanged)) {
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int nt = 0; nt < kN; ++nt)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              acc_o[b][mt][nt][0] *= fac[nt][0];
              acc_o[b][mt][nt][1] *= fac[nt][1];
              acc_o[b][mt][nt][2] *= fac[nt][0];
              acc_o[b][mt][nt][3] *= fac[nt][1];
            }
      }
      const unsigned char* vb = st + 64 * vw + 4 * g;
      const uint16_t* p_src = s_p + (vt * kPairs + lane % 8) * kPStride + (lane / 8) * 8;
#pragma unroll
      for (int kb = 0; kb < kKeys / 32; ++kb) {
        uint32_t pb[kN][4];  // keys 32kb .. 32kb+31: [0], [1] the first k16 step, [2], [3] the second
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) cuda::ldmatrix_x4(pb[nt], p_src + nt * 8 * kPStride + kb * 32);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int k0 = kb * 32 + kk * 16 + 2 * c;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const unsigned char* col = vb + 32 * b;
            const uint32_t u0 = *reinterpret_cast<const uint32_t*>(col + k0 * kRowBytes);
            const uint32_t u1 = *reinterpret_cast<const uint32_t*>(col + (k0 + 1) * kRowBytes);
            const uint32_t u2 = *reinterpret_cast<const uint32_t*>(col + (k0 + 8) * kRowBytes);
            const uint32_t u3 = *reinterpret_cast<const uint32_t*>(col + (k0 + 9) * kRowBytes);
            // Byte j of a row piece is dim 64vw + 32b + 4g + j; (key, key + 1) byte pairs per dim,
            // j = 2mt + (row g + 8).
            const uint32_t lo[2] = {__byte_perm(u0, u1, 0x5140), __byte_perm(u0, u1, 0x7362)};
            const uint32_t hi[2] = {__byte_perm(u2, u3, 0x5140), __byte_perm(u2, u3, 0x7362)};
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              uint32_t a[4];
              e4m3x4_to_f16x2x2(lo[mt], a[0], a[1]);
              e4m3x4_to_f16x2x2(hi[mt], a[2], a[3]);
#pragma unroll
              for (int nt = 0; nt < kN; ++nt)
                cuda::mma_f16_16816(acc_o[b][mt][nt], a, pb[nt][2 * kk], pb[nt][2 * kk + 1]);
            }
          }
        }
      }
      cuda::named_barrier_sync(kBarValues, kRoleThreads);  // every value warp is done with the stage and P
      if (tid == kProducer && i + kStages < n_tiles) issue(static_cast<int>(tile + kStages));
    }
    if (lane % 8 == 0)
#pragma unroll
      for (int r = 0; r < kN; ++r) s_unit[vt * kPairs + (vw % 2) * 4 * kN + 4 * r + lane / 8] = unit[r];
  }
  __syncthreads();  // every warp is done with the stages, which now stage the output; l, m and the units are out

  float* s_out = reinterpret_cast<float*>(smem);
  if (warp >= 8) {
    const float* u_out = s_unit + vt * kPairs;
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      const int pair = nt * 8 + 2 * c;
      const float l0 = s_l[pair], l1 = s_l[pair + 1];
      const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
      const float u0 = u_out[pair], u1 = u_out[pair + 1];
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float* d = s_out + pair * kOutStride + 64 * vw + 32 * b + 4 * g + 2 * mt;
          d[0] = acc_o[b][mt][nt][0] * u0 * inv0;
          d[kOutStride] = acc_o[b][mt][nt][1] * u1 * inv1;
          d[1] = acc_o[b][mt][nt][2] * u0 * inv0;
          d[kOutStride + 1] = acc_o[b][mt][nt][3] * u1 * inv1;
        }
    }
  }
  __syncthreads();
  cuda::mla_tc::finish_splits<kMerge, kThreads>(p, s_out, s_l, s_m, n_pairs, pair_base, work.pairs, work.ctas,
                                                first_row, split, part_out, part_lse, sync, s_out, tid,
                                                [] { __syncthreads(); });
#endif
}

template <int kN, int kRope>
cudaError_t launch_kernel(const cuda::MlaDecodeParams& p, cudaStream_t stream, bool pdl, float* part_out,
                          float* part_lse, bool& merged) {
  return cuda::mla_tc::launch_decode_grid<fp8_mla_direct_kernel<kN, kRope, false>,
                                          fp8_mla_direct_kernel<kN, kRope, true>, Smem<kN, kRope>::kBytes, 8 * kN,
                                          kThreads>(p, stream, pdl, part_out, part_lse, merged);
}

template <int kRope>
cudaError_t launch_rope(int ntiles, const cuda::MlaDecodeParams& p, cudaStream_t stream, bool pdl, float* part_out,
                        float* part_lse, bool& merged) {
  switch (ntiles) {
    case 1: return launch_kernel<1, kRope>(p, stream, pdl, part_out, part_lse, merged);
    case 2: return launch_kernel<2, kRope>(p, stream, pdl, part_out, part_lse, merged);
    case 3: return launch_kernel<3, kRope>(p, stream, pdl, part_out, part_lse, merged);
    default: return launch_kernel<4, kRope>(p, stream, pdl, part_out, part_lse, merged);
  }
}

size_t largest_smem_bytes() {
  return std::max({Smem<1, 64>::kBytes, Smem<2, 64>::kBytes, Smem<3, 64>::kBytes, Smem<4, 64>::kBytes});
}

// sm_90 or newer with room for the largest instance's shared memory, per device.
bool device_takes_direct() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static std::atomic<int> known[64] = {};  // 0 unknown, 1 yes, 2 no (two threads' first calls store the same)
  if (device < 0 || device >= 64) return false;
  if (known[device].load(std::memory_order_relaxed) == 0) {
    int major = 0, smem = 0;
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                     cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
                     major >= 9 && static_cast<size_t>(smem) >= largest_smem_bytes();
    known[device].store(yes ? 1 : 2, std::memory_order_relaxed);
  }
  return known[device].load(std::memory_order_relaxed) == 1;
}

}  // namespace

bool direct_attend_forced_off() {
  static const bool off = [] {
    const char* v = std::getenv("KILN_FP8MLA_ATTEND");
    return v != nullptr && std::strcmp(v, "widened") == 0;
  }();
  return off;
}

bool direct_attend_takes(const RowShape& s, int64_t block_size, int64_t selected_width, const void* pages) {
  if (s.latent != cuda::kMlaLatentDim || (s.rope != cuda::kMlaRopeDim && s.rope != 0) || selected_width != 0)
    return false;
  if (!(block_size > 0 && (block_size % kKeys == 0 || block_size == 8 || block_size == 16 || block_size == 32)))
    return false;
  if (reinterpret_cast<uintptr_t>(pages) % 16 != 0) return false;
  return device_takes_direct();
}

const char* launch_direct_attend(const cuda::MlaDecodeParams& p, void* stream_handle) {
  if (p.num_queries == 0) return nullptr;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const int64_t rows = p.num_queries * p.num_heads;
  float* part_out = static_cast<float*>(p.workspace);
  float* part_lse = p.num_splits > 1 ? part_out + static_cast<int64_t>(p.num_splits) * rows * cuda::kMlaLatentDim : nullptr;
  const int ntiles = cuda::mla_tc::ntiles_for(p.row_groups ? p.max_group_rows : 1, p.num_heads);
  static const bool pdl = cuda::mla_decode_pdl_default();
  bool merged = false;
  cudaError_t e = p.rope_dim == 0 ? launch_rope<0>(ntiles, p, stream, pdl, part_out, part_lse, merged)
                                  : launch_rope<64>(ntiles, p, stream, pdl, part_out, part_lse, merged);
  if (e == cudaSuccess && p.num_splits > 1 && !merged) e = cuda::mla_tc::launch_split_merge(p, stream, pdl, part_out, part_lse);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kiln::fp8mla

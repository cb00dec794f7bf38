// fp8_ds_mla decode attention that multiplies the fp8 rows where they land (sm_90+), for dense pages (no DSA
// selection) of 8, 16, 32 or a multiple of 64 slots. Same plan, splits, workspace, merge and output as the SDK's
// tensor-core attention (kiln/cuda/mla_decode_tc.cuh, whose tail `finish_splits` it calls); what differs is the
// tile loop, run by 16 warps (the c1 loop is latency-bound: 8 warps left 70 % of issue cycles without a ready warp):
// - A tile of 64 keys arrives as one to eight bulk copies of whole page runs (the rows are contiguous in a page),
//   three tiles in flight on mbarriers — no per-row copy instructions, no staging pass. Rows past the CTA's last
//   key are zeroed in shared memory before use (stale slots may hold any bytes, NaN included).
// - Scores: warp w takes keys 32·(w % 2) .. + 31 over half of the latent's scale tile T = w / 4 (64 of dims
//   128T .. 128T + 127, plus rope dims 16T .. 16T + 15 in the first half): eight partials a key, summed in a fixed
//   order by the softmax. e4m3 → f16 is exact (one cvt per two values), so the latent products are fp16 mma with q
//   in fp16 (in registers), scaled per (pair, warp) by a power of two into range (|q · 2^−e| < 2^15); each key's
//   scale and 2^e multiply the fp32 partial, then the bf16 rope part is added with a bf16 mma. The k order inside a
//   tile is permuted (both operands alike) so that one 8-byte load feeds two k16 steps without bank conflicts.
//   (Four partials a key — 16 keys a warp over a whole scale tile, q's fragments shared through shared memory —
//   issued 11 % fewer instructions and ran 2–11 % slower on an H100: bench/RESULTS.md.)
// - Values: warp w owns latent dims 32w .. 32w + 31 (scale tile w / 4). Vᵀ's fragments are built from four 4-byte
//   row loads per k16 step, byte-interleaved (prmt) into e4m3 pairs of adjacent keys and converted to f16; the
//   output dims are permuted among the warp's lanes so those loads are contiguous (undone when the output is
//   staged). The per-(key, T) scale goes into the attention weights instead: P_T = e · scale / U in fp16, one copy
//   of P per T, with U a power of two per (pair, T) ≥ the largest weight e · scale of the tile and ≥ the carried
//   unit (so P_T ≤ 1, and a key whose scale is huge but whose weight is ~0 does not push the others' weights below
//   fp16's range); the accumulators are rescaled by alpha · U_old / U_new (skipped when every factor is 1), and the
//   output multiplied by U at the end.
// Accuracy: the rows are used exactly (e4m3 · scale, no bf16 rounding of the widened values); q is rounded to
// fp16 (11 significant bits, against bf16's 8) and the weights to fp16 — 5–10× closer to the host's fp32
// attention than the widened form (Fp8MlaDirectAttention.*).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kProducer = kThreads - 1;  // the thread that issues the copies (idle in the softmax up to 24 pairs)
constexpr int kStages = 3;
constexpr int kGroups = 4;               // the latent's 128-value scale tiles
constexpr int kScoreGroups = 8;          // score partials: each scale tile's dims in two halves
constexpr int kPartStride = kKeys + 4;   // fp32 partial scores [score group][pair][key]
constexpr int kPStride = kKeys + 8;      // fp16 weights [group][pair][key]
constexpr int kOutStride = static_cast<int>(cuda::kMlaLatentDim) + 4;
constexpr int kSoftmaxThreads = 16;      // per pair, 4 keys each
constexpr int kMaxPieces = 8;            // bulk copies a tile (pages of 8 slots)
constexpr float kLog2e = 1.4426950408889634f;

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

template <int kN, int kRope>
struct Smem {
  static constexpr int kPairs = 8 * kN;
  static constexpr size_t kPart = size_t{kStages} * Geo<kRope>::kStageBytes;
  static constexpr size_t kP = kPart + sizeof(float) * kScoreGroups * kPairs * kPartStride;
  static constexpr size_t kScales = kP + sizeof(uint16_t) * kGroups * kPairs * kPStride;  // fp32 [group][key]
  static constexpr size_t kStats = kScales + sizeof(float) * kGroups * kKeys;
  // l, m per pair; the accumulator factor and the unit per (group, pair); the producer's next page ids
  static constexpr size_t kBars =
      (kStats + sizeof(float) * (2 * kPairs + 2 * kGroups * kPairs) + 4 * kMaxPieces + 7) / 8 * 8;
  static constexpr size_t kBytes = kBars + sizeof(uint64_t) * kStages;
  static_assert(sizeof(float) * kPairs * kOutStride <= kPart, "the output staging fits in the stages");
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
  uint16_t* s_p = reinterpret_cast<uint16_t*>(smem + L::kP);
  float* s_scale = reinterpret_cast<float*>(smem + L::kScales);  // the tile's key scales, as the score phase read them
  float* s_l = reinterpret_cast<float*>(smem + L::kStats);
  float* s_m = s_l + kPairs;
  float* s_fac = s_m + kPairs;            // [group][pair]: alpha · U_old / U_new of the last tile
  float* s_unit = s_fac + kGroups * kPairs;  // [group][pair]: U after the last tile
  int32_t* next_ids = reinterpret_cast<int32_t*>(s_unit + kGroups * kPairs);  // the producer's alone
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
  const int64_t first_row = p.row_groups ? p.row_groups[blockIdx.z] : blockIdx.z;
  const int heads = static_cast<int>(p.num_heads);
  const int pairs = (p.row_groups ? p.row_groups[blockIdx.z + 1] - static_cast<int>(first_row) : 1) * heads;
  const int ctas = (pairs + kPairs - 1) / kPairs;
  if (static_cast<int>(blockIdx.x) >= ctas) return;  // whole CTA: before any barrier
  const int chunk = (pairs + ctas - 1) / ctas;
  const int m0 = blockIdx.x * chunk;
  const int n_pairs = min(m0 + chunk, pairs) - m0;
  const int64_t pair_base = first_row * heads + m0;
  int kv_len = 0;  // the longest row among this CTA's
  for (int r = m0 / heads; r <= (m0 + n_pairs - 1) / heads; ++r) kv_len = max(kv_len, p.kv_len[first_row + r]);
  const int32_t* block_table = p.block_tables + static_cast<int64_t>(p.query_seq[first_row]) * p.max_blocks;
  const int64_t n_keys = kv_len;
  const int64_t tiles_total = (n_keys + kKeys - 1) / kKeys;
  const int64_t tiles_per_split = p.split_by_length ? cuda::mla_decode_tiles_per_split(tiles_total)
                                                    : (tiles_total + p.num_splits - 1) / p.num_splits;
  const int64_t tile_begin = split * tiles_per_split;
  const int64_t tile_end = min(tiles_total, tile_begin + tiles_per_split);

  // The producer is thread kProducer: a tile is `pieces` runs of `piece_rows` contiguous rows (one page, or a 64-slot
  // piece of a larger page); runs wholly past the last key are not copied. The page ids of the next tile to copy
  // are read one copy ahead (into shared memory, not registers: the other threads need every register), so a
  // copy never waits for its block-table load.
  // No 64-bit division here: it runs while the other warps wait at the next barrier. Page j of a tile is block
  // tile · pieces + j (pages of ≤ 64 slots), or the tile is piece tile % tiles_per_page of block
  // tile / tiles_per_page (pages of 64·k slots) — 32-bit, as positions are.
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

  // This warp's share of q: key half kh, score group gq = half hf of scale tile grp — lane c's 8-byte pieces
  // o_c + 16m of the tile for m = 2hf, 2hf + 1 (the other half's lanes take the other two) — and, for hf = 0,
  // rope dims 16·grp onward.
  const int kh = warp % 2, gq = warp / 2, grp = gq / 2, hf = gq % 2;
  const int o_c = (c & 1) * 8 + (c >> 1) * 64;  // byte offset of lane c's 8-byte pieces in a 128-value tile
  uint32_t qf[4][kN][2];                        // latent k16 steps, fp16, 2^−e scaled
  uint32_t qr[kN][2];                           // the rope k16 step, bf16
  float pe[kN][2];                              // 2^e of accumulator columns 8nt + 2c, 8nt + 2c + 1
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const int pair = nt * 8 + g;
    const bool valid = pair < n_pairs;
    const float* src = p.q + (pair_base + (valid ? pair : 0)) * G::kRow;
    float v[2][8];
    float amax = 0.f;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const float4 lo = *reinterpret_cast<const float4*>(src + grp * 128 + o_c + 16 * (2 * hf + m));
      const float4 hi = *reinterpret_cast<const float4*>(src + grp * 128 + o_c + 16 * (2 * hf + m) + 4);
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
    for (int m = 0; m < 2; ++m)
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

  // Softmax: threads 16i .. 16i+15 own pair i (keys 4j .. 4j+3 of each tile for thread 16i + j); the running max,
  // sum and units are the same in every thread of a pair.
  const int sm_pair = tid / kSoftmaxThreads, sm_part = tid % kSoftmaxThreads;
  const bool sm_active = sm_pair < kPairs;
  const int64_t sm_keys = sm_pair >= n_pairs ? 0 : p.kv_len[first_row + (m0 + sm_pair) / heads];
  float sm_m = -INFINITY, sm_l = 0.f;
  float unit[kGroups] = {0.f, 0.f, 0.f, 0.f};  // U per scale tile for this thread's pair

  float acc_o[2][kN][4];  // dims 32·warp + 4g + 2mt (rows g) and + 1 (rows g + 8) × the pairs
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc_o[mt][nt][k] = 0.f;

  const float score_scale = p.scale * kLog2e;  // softmax in base 2
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int i = static_cast<int>(tile - tile_begin);
    const int stage = i % kStages;
    const unsigned char* st = smem + static_cast<size_t>(stage) * G::kStageBytes;
    cuda::mbarrier_wait(bar0 + 8 * stage, static_cast<uint32_t>((i / kStages) & 1));
    const int valid_rows = static_cast<int>(min(static_cast<int64_t>(kKeys), n_keys - tile * kKeys));
    if (valid_rows < kKeys) {  // the last tile: rows past the last key are zeros, whatever their slots held
      uint4* z = reinterpret_cast<uint4*>(smem + static_cast<size_t>(stage) * G::kStageBytes + valid_rows * kRowBytes);
      const int n16 = (kKeys - valid_rows) * kRowBytes / 16;
      for (int k = tid; k < n16; k += kThreads) z[k] = make_uint4(0u, 0u, 0u, 0u);
      cuda::fence_proxy_async_shared();
      __syncthreads();
    }

    // Partial scores S[key, pair] over this warp's keys and scale tile.
    {
      float acc[2][kN][4];
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
        for (int m = 0; m < 2; ++m) {
          const uint2 x = *reinterpret_cast<const uint2*>(r0 + grp * 128 + o_c + 16 * (2 * hf + m));
          const uint2 y = *reinterpret_cast<const uint2*>(r1 + grp * 128 + o_c + 16 * (2 * hf + m));
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
        if (c == 0 && hf == 0) {  // for the softmax threads, whose row-strided reads of them would meet in one bank
          s_scale[grp * kKeys + kh * 32 + mt * 16 + g] = ks0;
          s_scale[grp * kKeys + kh * 32 + mt * 16 + g + 8] = ks1;
        }
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) {
          acc[mt][nt][0] *= ks0 * pe[nt][0];
          acc[mt][nt][1] *= ks0 * pe[nt][1];
          acc[mt][nt][2] *= ks1 * pe[nt][0];
          acc[mt][nt][3] *= ks1 * pe[nt][1];
        }
        if (kRope > 0 && hf == 0) {
          const unsigned char* q0 = r0 + G::kRopeAt + 32 * grp + 4 * c;
          const unsigned char* q1 = r1 + G::kRopeAt + 32 * grp + 4 * c;
          const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(q0), *reinterpret_cast<const uint32_t*>(q1),
                                 *reinterpret_cast<const uint32_t*>(q0 + 16), *reinterpret_cast<const uint32_t*>(q1 + 16)};
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) cuda::mma_bf16_16816(acc[mt][nt], a, qr[nt][0], qr[nt][1]);
        }
      }
      cuda::mla_tc::store_score_partials<kN, kPartStride>(s_part + gq * kPairs * kPartStride, acc, kh * 32, g, c);
    }
    __syncthreads();  // partial scores complete; the previous tile's stage is read by every warp
    if (tid == kProducer && i >= 1 && tile - 1 + kStages < tile_end) issue(static_cast<int>(tile - 1 + kStages));

    // Online softmax over the tile (the eight score groups' partials summed in a fixed order), then the weights per
    // scale tile: P_T = e · scale / U.
    if (sm_active) {
      float s[4];
      {
        const float* src = s_part + sm_pair * kPartStride + sm_part * 4;
        const float4 a = *reinterpret_cast<const float4*>(src);
        s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w;
#pragma unroll
        for (int q = 1; q < kScoreGroups; ++q) {
          const float4 x = *reinterpret_cast<const float4*>(src + q * kPairs * kPartStride);
          s[0] += x.x, s[1] += x.y, s[2] += x.z, s[3] += x.w;
        }
      }
      const int64_t limit64 = sm_keys - (tile * kKeys + sm_part * 4);  // keys j < limit are visible to the pair
      const int limit = limit64 < 0 ? 0 : limit64 > 4 ? 4 : static_cast<int>(limit64);
#pragma unroll
      for (int j = 0; j < 4; ++j) s[j] = j < limit ? s[j] * score_scale : -INFINITY;
      float e[4];
      const float alpha = cuda::mla_tc::online_softmax_step<4, kSoftmaxThreads>(s, e, sm_m, sm_l);

#pragma unroll
      for (int t = 0; t < kGroups; ++t) {
        const float4 sc = *reinterpret_cast<const float4*>(s_scale + t * kKeys + sm_part * 4);
        const float w[4] = {e[0] * sc.x, e[1] * sc.y, e[2] * sc.z, e[3] * sc.w};
        float wmax = fmaxf(fmaxf(w[0], w[1]), fmaxf(w[2], w[3]));
#pragma unroll
        for (int off = kSoftmaxThreads / 2; off > 0; off /= 2) wmax = fmaxf(wmax, __shfl_xor_sync(~0u, wmax, off));
        const float carried = unit[t] * alpha;
        const float u = fmaxf(pow2_ceil(wmax), pow2_ceil(carried));
        unit[t] = u;
        const float inv_u = pow2_inverse(u);  // (2^127 for u = 0, when every w and carried are 0)
        *reinterpret_cast<uint2*>(s_p + (t * kPairs + sm_pair) * kPStride + sm_part * 4) =
            make_uint2(pack_f16x2(w[0] * inv_u, w[1] * inv_u), pack_f16x2(w[2] * inv_u, w[3] * inv_u));
        if (sm_part == 0) s_fac[t * kPairs + sm_pair] = u > 0.f ? carried * inv_u : 1.f;  // ≤ 1
      }
    }
    __syncthreads();

    // Values: O[dim, pair] += V[key, dim]ᵀ · P_T[pair, key]ᵀ over this warp's 32 dims (scale tile warp / 4).
    {
      const int vt = warp / 4;
      float fac[kN][2];
      bool unchanged = true;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        fac[nt][0] = s_fac[vt * kPairs + nt * 8 + 2 * c], fac[nt][1] = s_fac[vt * kPairs + nt * 8 + 2 * c + 1];
        unchanged = unchanged && fac[nt][0] == 1.f && fac[nt][1] == 1.f;
      }
      // Once a row's max and units settle, most tiles leave every factor at exactly 1.
      if (!__all_sync(~0u, unchanged)) {
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            acc_o[mt][nt][0] *= fac[nt][0];
            acc_o[mt][nt][1] *= fac[nt][1];
            acc_o[mt][nt][2] *= fac[nt][0];
            acc_o[mt][nt][3] *= fac[nt][1];
          }
      }
      const unsigned char* vb = st + 32 * warp + 4 * g;
      const uint16_t* p_src = s_p + (vt * kPairs + lane % 8) * kPStride + (lane / 8) * 8;
#pragma unroll
      for (int kb = 0; kb < kKeys / 32; ++kb) {
        uint32_t pb[kN][4];  // keys 32kb .. 32kb+31: [0], [1] the first k16 step, [2], [3] the second
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) cuda::ldmatrix_x4(pb[nt], p_src + nt * 8 * kPStride + kb * 32);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int k0 = kb * 32 + kk * 16 + 2 * c;
          const uint32_t u0 = *reinterpret_cast<const uint32_t*>(vb + k0 * kRowBytes);
          const uint32_t u1 = *reinterpret_cast<const uint32_t*>(vb + (k0 + 1) * kRowBytes);
          const uint32_t u2 = *reinterpret_cast<const uint32_t*>(vb + (k0 + 8) * kRowBytes);
          const uint32_t u3 = *reinterpret_cast<const uint32_t*>(vb + (k0 + 9) * kRowBytes);
          // Byte j of a row piece is dim 32·warp + 4g + j; (key, key + 1) byte pairs per dim, j = 2mt + (row g + 8).
          const uint32_t lo[2] = {__byte_perm(u0, u1, 0x5140), __byte_perm(u0, u1, 0x7362)};
          const uint32_t hi[2] = {__byte_perm(u2, u3, 0x5140), __byte_perm(u2, u3, 0x7362)};
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            uint32_t a[4];
            e4m3x4_to_f16x2x2(lo[mt], a[0], a[1]);
            e4m3x4_to_f16x2x2(hi[mt], a[2], a[3]);
#pragma unroll
            for (int nt = 0; nt < kN; ++nt) cuda::mma_f16_16816(acc_o[mt][nt], a, pb[nt][2 * kk], pb[nt][2 * kk + 1]);
          }
        }
      }
    }
  }
  if (sm_active && sm_part == 0) {
    s_l[sm_pair] = sm_l;
    s_m[sm_pair] = sm_m;
#pragma unroll
    for (int t = 0; t < kGroups; ++t) s_unit[t * kPairs + sm_pair] = unit[t];
  }
  __syncthreads();  // every warp is done with the stages, which now stage the output

  float* s_out = reinterpret_cast<float*>(smem);
  const float* u_out = s_unit + (warp / 4) * kPairs;
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const int pair = nt * 8 + 2 * c;
    const float l0 = s_l[pair], l1 = s_l[pair + 1];
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const float u0 = u_out[pair], u1 = u_out[pair + 1];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      float* d = s_out + pair * kOutStride + 32 * warp + 4 * g + 2 * mt;
      d[0] = acc_o[mt][nt][0] * u0 * inv0;
      d[kOutStride] = acc_o[mt][nt][1] * u1 * inv1;
      d[1] = acc_o[mt][nt][2] * u0 * inv0;
      d[kOutStride + 1] = acc_o[mt][nt][3] * u1 * inv1;
    }
  }
  __syncthreads();
  cuda::mla_tc::finish_splits<kMerge, kThreads>(p, s_out, s_l, s_m, n_pairs, pair_base, pairs, ctas, first_row, split,
                                                part_out, part_lse, sync, s_out, tid, [] { __syncthreads(); });
#endif
}

template <int kN, int kRope>
cudaError_t launch_kernel(const cuda::MlaDecodeParams& p, cudaStream_t stream, bool pdl, float* part_out,
                          float* part_lse, bool& merged) {
  return cuda::mla_tc::launch_decode_grid<fp8_mla_direct_kernel<kN, kRope, false>, fp8_mla_direct_kernel<kN, kRope, true>,
                                          Smem<kN, kRope>::kBytes, 8 * kN, kThreads>(p, stream, pdl, part_out, part_lse,
                                                                                     merged);
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

// sm_90 or newer with room for the largest instance's shared memory, per device.
bool device_takes_direct() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static int known[64] = {};  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    int major = 0, smem = 0;
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                     cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
                     major >= 9 && static_cast<size_t>(smem) >= Smem<4, 64>::kBytes;
    known[device] = yes ? 1 : 2;
  }
  return known[device] == 1;
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

// The tensor-core absorbed-MLA decode attention (kiln/cuda/mla_decode_plan.h says what it computes), as a kernel
// template over a row source, so every KV layout whose rows widen to bf16 gets the same attention: the built-in
// bf16 layout copies its rows straight into the bf16 tiles; a quantized layout (fp8_ds_mla) stages its raw rows in
// shared memory and widens a tile at a time. nvcc only; everything here has internal linkage, so the core and a
// plugin can each instantiate it without their kernels' symbols meeting.
//
// A row source `Rows` provides:
//   static constexpr int kRopeDim;           64 or 0: the rope values after the 512 latent ones
//   static constexpr int kStagedRowBytes;    0: copy_row writes bf16 rows into the tile; else the bytes of one raw
//                                            row in shared memory (a multiple of 16), widened by widen()
//   __device__ static void copy_row(const void* cache, int64_t slot, uint16_t* tile_row, unsigned char* staged_row,
//                                   int lane);
//       the lane's share of one row's cp.async copy (the whole warp calls it; slot < 0 zero-fills)
//   __device__ static void widen(const unsigned char* staged, uint16_t* tile, int row_stride, int tid, int threads);
//       the whole CTA turns kMlaDecodeTile staged rows into bf16 tile rows (row_stride bf16 apart): 512 latent
//       values then kRope rope values; an all-zero staged row must widen to zeros
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/cuda/mla_decode_plan.h"
#include "kiln/cuda/pdl_launch.cuh"
#include "kiln/cuda/warp_mma.cuh"

namespace kiln::cuda {
namespace {  // internal linkage: see above
namespace mla_tc {

constexpr int kTile = static_cast<int>(kMlaDecodeTile);  // keys per pipeline stage
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxPairs = static_cast<int>(kMlaMaxPairs);  // (row, head) pairs per CTA: up to 4 n8 tiles of the mma
// Score phase: warp w multiplies keys 32·(w % 2) .. + 31 of the tile by q over dims (row / 4)·(w / 2) onward, so
// each warp keeps its quarter of q in registers for the whole kernel and reads every K value from shared memory
// once; the four quarters' partial scores meet in shared memory.
constexpr int kDimQuarters = 4;

// A cached row: the 512 latent values, then kRope roped k_pe values (64: GLM-4.7 / DeepSeek; 0: GLM-5.3-Flash's
// NoPE DSA layers).
template <int kRope>
struct RowGeometry {
  static constexpr int kRow = static_cast<int>(kMlaLatentDim) + kRope;
  // smem row pitch in bf16: 1168 or 1040 bytes, odd multiples of 16, so fragment reads avoid bank conflicts
  static constexpr int kRowStride = kRow + 8;
  static constexpr int kChunksPerRow = kRow * 2 / 16;  // 16-byte copies per cached row
  static constexpr int kQuarterDims = kRow / kDimQuarters;
  static constexpr int kQuarterSteps = kQuarterDims / 16;  // k16 steps per quarter
  static_assert(kQuarterDims % 16 == 0, "a quarter of the row is whole k16 steps");
};
constexpr int kPartStride = kTile + 4;            // fp32 partial scores [quarter][pair][key]
constexpr int kPStride = kTile + 8;               // bf16 softmax weights [pair][key]
constexpr int kOutStride = static_cast<int>(kMlaLatentDim) + 4;  // fp32 output staging [pair][dim]
constexpr int kSoftmaxThreads = 8;                // per pair, 8 keys each
constexpr float kLog2e = 1.4426950408889634f;

template <int kN, class Rows>
struct Smem {
  static constexpr int kRowStride = RowGeometry<Rows::kRopeDim>::kRowStride;
  static constexpr int kPairs = 8 * kN;
  static constexpr bool kStaged = Rows::kStagedRowBytes > 0;
  // bf16 tiles [kTile][kRowStride]: two pipeline stages, or one when the rows arrive staged (then two stages of raw
  // rows follow, widened into the one tile); the output staging reuses both after the loop.
  static constexpr int kBf16Tiles = kStaged ? 1 : 2;
  static constexpr size_t kKv = 0;
  static constexpr size_t kStaging = kKv + sizeof(uint16_t) * kBf16Tiles * kTile * kRowStride;
  static constexpr size_t kPart = kStaging + (kStaged ? size_t{2} * kTile * Rows::kStagedRowBytes : 0);
  static constexpr size_t kP = kPart + sizeof(float) * kDimQuarters * kPairs * kPartStride;
  static constexpr size_t kStats = kP + sizeof(uint16_t) * kPairs * kPStride;  // alpha, l, m per pair
  static constexpr size_t kValid = kStats + sizeof(float) * 3 * kPairs;        // [slot][warp] 8-key bit masks
  static constexpr size_t kBytes = kValid + 3 * kWarps;
  static_assert(sizeof(float) * kPairs * kOutStride <= kPart, "the output staging fits in the KV stages");
  static_assert(Rows::kStagedRowBytes % 16 == 0, "staged rows are whole 16-byte pieces");
};

// The merge of a (query, head)'s splits, in two steps. The decode kernel's own merge (below) runs both; the
// standalone merge kernel runs the first and the same sums as the second in the same order with its own thread
// mapping (its loads coalesce better), so a row's bits do not depend on which one merged it
// (GpuMlaDecode.KernelSideMergeMatchesTheSeparateMerge):
//   mla_merge_weights: one warp: m = the largest log-sum-exp, w_s = exp(lse_s − m) into shared memory, and
//     1 / Σ w_s (lane-strided sums, then a butterfly);
//   mla_merge_piece: four lanes of a warp per 4-value column piece: lane g sums w_s · partial_s over splits g, g + 4,
//     ... in order, and the first of the four adds the four in lane order and scales by 1 / Σ w_s.
// Empty splits (lse −∞, w 0) never contribute their partial (it was not written).
constexpr int kCombineLanes = 4;
constexpr int kPiecesPerRow = static_cast<int>(kMlaLatentDim) / 4;  // float4 pieces of one (query, head) output
constexpr int kCombineThreads = kCombineLanes * kPiecesPerRow;

// With `lse_out`, lane 0 also writes the merged log-sum-exp, m + ln Σ w_s (−inf when every split was empty).
__device__ __forceinline__ void mla_merge_weights(const float* __restrict__ part_lse, int64_t rows, int num_splits,
                                                  int64_t qh, float* s_w, float* s_inv, int lane,
                                                  float* __restrict__ lse_out = nullptr) {
  // The lse values pass through s_w (each lane rereads only what it wrote): a second __ldcg pass would be another
  // L2 round trip on the merge's critical path.
  float m = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) {
    const float lse = __ldcg(part_lse + s * rows + qh);
    s_w[s] = lse;
    m = fmaxf(m, lse);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(~0u, m, off));
  float total = 0.f;
  for (int s = lane; s < num_splits; s += 32) {
    const float lse = s_w[s];
    const float w = lse == -INFINITY ? 0.f : expf(lse - m);
    s_w[s] = w;
    total += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(~0u, total, off);
  if (lane == 0) *s_inv = total > 0.f ? 1.f / total : 0.f;
  if (lane == 0 && lse_out) lse_out[qh] = total > 0.f ? m + logf(total) : -INFINITY;
}

// Every lane of the warp calls it (the shuffles); `active` false for lanes without a piece.
__device__ __forceinline__ void mla_merge_piece(const float* __restrict__ part_out, int64_t rows, int num_splits,
                                                int64_t qh, int col4, const float* s_w, float inv, bool active,
                                                float* __restrict__ out, uint16_t* __restrict__ out_bf16) {
  const int g = threadIdx.x % kCombineLanes;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (active) {
#pragma unroll 4
    for (int s = g; s < num_splits; s += kCombineLanes) {
      const float w = s_w[s];
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part_out + (s * rows + qh) * kMlaLatentDim) + col4);
      if (w != 0.f) acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
  }
  float4 sum = acc;
#pragma unroll
  for (int k = 1; k < kCombineLanes; ++k) {
    const float x = __shfl_down_sync(~0u, acc.x, k), y = __shfl_down_sync(~0u, acc.y, k);
    const float z = __shfl_down_sync(~0u, acc.z, k), w = __shfl_down_sync(~0u, acc.w, k);
    sum.x += x, sum.y += y, sum.z += z, sum.w += w;
  }
  if (!active || g != 0) return;
  const float4 v = make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv);
  if (out) reinterpret_cast<float4*>(out + qh * kMlaLatentDim)[col4] = v;
  if (out_bf16)
    reinterpret_cast<uint2*>(out_bf16 + qh * kMlaLatentDim)[col4] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// The standalone merge: one block per (query, head); thread group g = tid / 128 is mla_merge_piece's lane g for
// all 128 column pieces (the same sums in the same order, so the same bits), each warp's loads one contiguous
// 512-byte row piece of a split.
__global__ void __launch_bounds__(kCombineThreads) mla_decode_combine_kernel(const float* __restrict__ part_out,
                                                                          const float* __restrict__ part_lse,
                                                                          int64_t rows, int num_splits,
                                                                          float* __restrict__ out,
                                                                          uint16_t* __restrict__ out_bf16,
                                                                          float* __restrict__ out_lse) {
  __shared__ float s_w[kMlaMaxSplits];
  __shared__ float4 s_acc[kCombineLanes][kPiecesPerRow];
  __shared__ float s_inv;
  const int64_t qh = blockIdx.x;
  const int tid = threadIdx.x;
  pdl_wait();  // the partials of the decode kernel just before
  pdl_launch_dependents();
  if (tid < 32) mla_merge_weights(part_lse, rows, num_splits, qh, s_w, &s_inv, tid, out_lse);
  __syncthreads();
  const int g = tid / kPiecesPerRow, col4 = tid % kPiecesPerRow;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int s = g; s < num_splits; s += kCombineLanes) {
    const float w = s_w[s];
    if (w == 0.f) continue;
    const float4 v = reinterpret_cast<const float4*>(part_out + (s * rows + qh) * kMlaLatentDim)[col4];
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  s_acc[g][col4] = acc;
  __syncthreads();
  if (g != 0) return;
  float4 sum = s_acc[0][col4];
#pragma unroll
  for (int k = 1; k < kCombineLanes; ++k) {
    const float4 a = s_acc[k][col4];
    sum.x += a.x, sum.y += a.y, sum.z += a.z, sum.w += a.w;
  }
  const float inv = s_inv;
  const float4 v = make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv);
  if (out) reinterpret_cast<float4*>(out + qh * kMlaLatentDim)[col4] = v;
  if (out_bf16)
    reinterpret_cast<uint2*>(out_bf16 + qh * kMlaLatentDim)[col4] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

// A warp's partial scores S[key, pair] (two m16 tiles of keys from key0, kN n8 tiles of pairs, mma accumulator
// layout) into one [pair][key] fp32 slab of kPartStride keys a pair, where the softmax threads sum the slabs.
template <int kN, int kStride>
__device__ __forceinline__ void store_score_partials(float* slab, const float (&acc)[2][kN][4], int key0, int g, int c) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      float* d = slab + (nt * 8 + 2 * c) * kStride + key0 + mt * 16 + g;
      d[0] = acc[mt][nt][0];
      d[kStride] = acc[mt][nt][1];
      d[8] = acc[mt][nt][2];
      d[kStride + 8] = acc[mt][nt][3];
    }
}

// One online-softmax step of a pair whose scores for a tile are spread over kThreadsPerPair consecutive threads (a
// power of two ≤ 32), kK each, already scaled to base 2 and masked (−∞): the pair's running max m and sum l advance,
// e = 2^(s − m_new) (0 while no key is visible), and the returned alpha = 2^(m_old − m_new) rescales what was
// accumulated (1 while no key is visible). Every thread of the pair ends with the same m, l and alpha.
template <int kK, int kThreadsPerPair>
__device__ __forceinline__ float online_softmax_step(const float (&s)[kK], float (&e)[kK], float& m, float& l) {
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kK; ++j) tile_max = fmaxf(tile_max, s[j]);
#pragma unroll
  for (int off = kThreadsPerPair / 2; off > 0; off /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, off));
  const float m_new = fmaxf(m, tile_max);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    e[j] = m_new == -INFINITY ? 0.f : exp2f(s[j] - m_new);
    sum += e[j];
  }
#pragma unroll
  for (int off = kThreadsPerPair / 2; off > 0; off /= 2) sum += __shfl_xor_sync(~0u, sum, off);
  const float alpha = m_new == -INFINITY ? 1.f : exp2f(m - m_new);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

// What one decode CTA of the grid below takes (blockIdx: x = CTA of the row group, y = split, z = row group): the
// group's (row, head) pairs, row-major, spread evenly over the fewest CTAs of max_pairs pairs, and this split's
// tiles of the keys its rows can see (up to the longest kv_len among them, or the selection's width). Shared by
// this header's kernel and the layouts' own tile loops, so every form cuts a row the same way. Reads q-side state
// (kv_len, the tables): call after the PDL wait.
struct CtaWork {
  bool active = false;     // false: this blockIdx.x has no pairs (the whole CTA returns before any barrier)
  int64_t first_row = 0;   // the row group's first row
  int pairs = 0;           // the group's (row, head) pairs
  int ctas = 0;            // CTAs the group's pairs spread over
  int m0 = 0;              // this CTA's pairs are m0 .. m0 + n_pairs − 1 of the group
  int n_pairs = 0;
  int64_t pair_base = 0;   // flat (row, head) index of this CTA's pair 0
  int kv_len = 0;          // the longest row among this CTA's
  const int32_t* block_table = nullptr;
  int64_t n_keys = 0;      // kv_len, or selected_width with a selection
  int64_t tile_begin = 0, tile_end = 0;  // this split's tiles of kMlaDecodeTile keys
};

__device__ __forceinline__ CtaWork cta_work(const MlaDecodeParams& p, int max_pairs) {
  CtaWork w;
  w.first_row = p.row_groups ? p.row_groups[blockIdx.z] : blockIdx.z;
  const int heads = static_cast<int>(p.num_heads);
  w.pairs = (p.row_groups ? p.row_groups[blockIdx.z + 1] - static_cast<int>(w.first_row) : 1) * heads;
  w.ctas = (w.pairs + max_pairs - 1) / max_pairs;
  if (static_cast<int>(blockIdx.x) >= w.ctas) return w;
  w.active = true;
  const int chunk = (w.pairs + w.ctas - 1) / w.ctas;
  w.m0 = blockIdx.x * chunk;
  w.n_pairs = min(w.m0 + chunk, w.pairs) - w.m0;
  w.pair_base = w.first_row * heads + w.m0;
  for (int r = w.m0 / heads; r <= (w.m0 + w.n_pairs - 1) / heads; ++r) w.kv_len = max(w.kv_len, p.kv_len[w.first_row + r]);
  w.block_table = p.block_tables + static_cast<int64_t>(p.query_seq[w.first_row]) * p.max_blocks;
  w.n_keys = p.selected ? p.selected_width : w.kv_len;
  const int64_t tiles_total = (w.n_keys + kMlaDecodeTile - 1) / kMlaDecodeTile;
  const int64_t tiles_per_split =
      p.split_by_length ? mla_decode_tiles_per_split(tiles_total) : (tiles_total + p.num_splits - 1) / p.num_splits;
  w.tile_begin = blockIdx.y * tiles_per_split;
  w.tile_end = min(tiles_total, w.tile_begin + tiles_per_split);
  return w;
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The end of a decode CTA, shared by the kernels of this header and the Hopper one (kernels/cuda/mla_decode_sm90):
// s_out [pair][kOutStride] holds this CTA's normalised outputs and s_l / s_m each pair's softmax sum and base-2 max.
// Writes the output (one split) or this split's partial and log-sum-exp, and with kMerge merges the row group's
// splits inside the grid. Called by threads tid = 0 .. kThreadsT − 1 (whole warps), which `bar` synchronises;
// s_scratch is free shared memory for the merge weights ((splits + 1) floats per (query, head) of the share).
template <bool kMerge, int kThreadsT, class Barrier>
__device__ __forceinline__ void finish_splits(const MlaDecodeParams& p, const float* s_out, const float* s_l,
                                              const float* s_m, int n_pairs, int64_t pair_base, int pairs, int ctas,
                                              int64_t first_row, int split, float* part_out, float* part_lse,
                                              unsigned* sync, float* s_scratch, int tid, Barrier bar) {
  const int warp = tid / 32, lane = tid % 32;
  const int heads = static_cast<int>(p.num_heads);
  const bool direct = p.num_splits == 1;
  const int64_t rows = p.num_queries * p.num_heads;
  constexpr int kQuads = static_cast<int>(kMlaLatentDim) / 4;
  for (int i = tid; i < n_pairs * kQuads; i += kThreadsT) {
    const int pair = i / kQuads, col = (i % kQuads) * 4;
    const int64_t qh = pair_base + pair;
    const float4 v = *reinterpret_cast<const float4*>(s_out + pair * kOutStride + col);
    if (direct) {
      if (p.out) *reinterpret_cast<float4*>(p.out + qh * kMlaLatentDim + col) = v;
      if (p.out_bf16)
        *reinterpret_cast<uint2*>(p.out_bf16 + qh * kMlaLatentDim + col) =
            make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    } else if (s_l[pair] > 0.f) {  // an empty partial is never read by the combine
      *reinterpret_cast<float4*>(part_out + (split * rows + qh) * kMlaLatentDim + col) = v;
    }
  }
  if (tid < n_pairs && (!direct || p.out_lse)) {
    const float l = s_l[tid];
    const float lse = l > 0.f ? s_m[tid] / kLog2e + logf(l) : -INFINITY;
    if (direct) p.out_lse[pair_base + tid] = lse;
    else part_lse[split * rows + pair_base + tid] = lse;
  }
  if constexpr (!kMerge) return;
  // The merge inside this grid, instead of a second launch (its start, wait and drain cost more than the merge):
  // the launcher passes `sync` only when every CTA of the grid is resident at once, so waiting for the rest of the
  // row group cannot deadlock. Each CTA announces its partials, waits for its group's, then merges an even share
  // of the group's column pieces with the standalone kernel's sums. The two counters of the group end at zero (the
  // last CTA past the wait resets them) for the next launch.
  __threadfence();
  bar();
  const unsigned participants = static_cast<unsigned>(ctas) * static_cast<unsigned>(p.num_splits);
  if (tid == 0) {
    unsigned* arrived = sync + 2 * blockIdx.z;
    unsigned* passed = arrived + 1;
    atomicAdd(arrived, 1u);
    while (load_acquire(arrived) < participants) __nanosleep(32);
    if (atomicAdd(passed, 1u) == participants - 1) {
      atomicExch(arrived, 0u);
      atomicExch(passed, 0u);
    }
  }
  bar();
  const int64_t pieces = static_cast<int64_t>(pairs) * kPiecesPerRow;
  const int64_t me = static_cast<int64_t>(split) * ctas + blockIdx.x;
  const int64_t begin = pieces * me / participants, end = pieces * (me + 1) / participants;
  if (begin >= end) return;
  // The weights of the (query, head)s this share touches, one warp each, in the (now free) KV stages.
  const int64_t qh0 = first_row * heads + begin / kPiecesPerRow;
  const int n_qh = static_cast<int>((end - 1) / kPiecesPerRow - begin / kPiecesPerRow + 1);
  float* s_w = s_scratch;
  float* s_inv = s_w + static_cast<size_t>(n_qh) * p.num_splits;
  for (int j = warp; j < n_qh; j += kThreadsT / 32)
    mla_merge_weights(part_lse, rows, p.num_splits, qh0 + j, s_w + static_cast<size_t>(j) * p.num_splits, s_inv + j,
                      lane, p.out_lse);  // a pair split over two CTAs' shares: both write the same lse
  bar();
  for (int64_t base = begin; base < end; base += kThreadsT / kCombineLanes) {
    const int64_t i = base + tid / kCombineLanes;
    const bool active = i < end;
    const int j = active ? static_cast<int>(i / kPiecesPerRow - begin / kPiecesPerRow) : 0;
    mla_merge_piece(part_out, rows, p.num_splits, qh0 + j, static_cast<int>(i % kPiecesPerRow),
                    s_w + static_cast<size_t>(j) * p.num_splits, s_inv[j], active, p.out, p.out_bf16);
  }
}

// grid: (CTAs per row group, splits, row groups). A group's rows · heads (row, head) pairs, row-major, are spread
// evenly over the fewest CTAs of 8·kN pairs (the rest of blockIdx.x exits); each CTA streams one split of the keys
// its rows can see (up to the largest kv_len among them) once and masks every pair by its row's kv_len.
// One row per group is the plain decode case: CTA x takes heads 8·kN·x onward.
// kMerge: the instantiation that merges its splits itself (`sync` set); the other one is the plain kernel, its code
// untouched by the merge.
template <int kN, class Rows, bool kMerge>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_tc_kernel(MlaDecodeParams p, float* part_out,
                                                                    float* part_lse, unsigned* sync) {
  using L = Smem<kN, Rows>;
  using G = RowGeometry<Rows::kRopeDim>;
  constexpr bool kStaged = L::kStaged;
  constexpr int kRow = G::kRow, kRowStride = G::kRowStride;
  constexpr int kQuarterDims = G::kQuarterDims, kQuarterSteps = G::kQuarterSteps;
  constexpr int kPairs = L::kPairs;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* s_kv = reinterpret_cast<uint16_t*>(smem + L::kKv);
  unsigned char* s_staging = smem + L::kStaging;
  float* s_part = reinterpret_cast<float*>(smem + L::kPart);
  uint16_t* s_p = reinterpret_cast<uint16_t*>(smem + L::kP);
  float* s_alpha = reinterpret_cast<float*>(smem + L::kStats);
  float* s_l = s_alpha + kPairs;
  float* s_m = s_l + kPairs;
  uint8_t* s_valid = smem + L::kValid;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma group id
  const int c = lane % 4;  // thread in group
  const int split = blockIdx.y;
  // q, kv_len and the cache row of the newest token come from the kernels just before this one.
  pdl_wait();
  pdl_launch_dependents();
  const CtaWork work = cta_work(p, kPairs);
  if (!work.active) return;  // whole CTA: before any barrier
  const int64_t first_row = work.first_row;
  const int heads = static_cast<int>(p.num_heads);
  const int pairs = work.pairs, ctas = work.ctas, m0 = work.m0, n_pairs = work.n_pairs;
  const int64_t pair_base = work.pair_base;
  const int kv_len = work.kv_len;
  const int32_t* block_table = work.block_table;
  const int32_t* selected = p.selected ? p.selected + first_row * p.selected_width : nullptr;
  const int64_t n_keys = work.n_keys;
  const int64_t tile_begin = work.tile_begin, tile_end = work.tile_end;

  // Warp w copies rows 8w..8w+7 of each tile. Lane j < 8 looks up the slot of the warp's row j (one lookup per
  // row, −1 when not visible); the row source copies a row as 16-byte pieces over the warp's lanes, invisible rows
  // zero-filled (a zero weight times stale shared memory could be NaN), and the row's visibility goes to s_valid.
  constexpr int kRowsPerWarp = kTile / kWarps;
  static_assert(kRowsPerWarp == kSoftmaxThreads, "softmax thread j of a pair reads the visibility byte of warp j");
  auto slot_of = [&](int64_t tile) -> int64_t {
    const int64_t j = tile * kTile + warp * kRowsPerWarp + lane;
    if (tile >= tile_end || lane >= kRowsPerWarp || j >= n_keys) return -1;
    const int64_t pos = selected ? selected[j] : j;
    if (pos < 0 || pos >= kv_len) return -1;
    return static_cast<int64_t>(block_table[pos / p.block_size]) * p.block_size + pos % p.block_size;
  };
  auto issue_rows = [&](int64_t slot_lane, int stage) {
    const int row0 = warp * kRowsPerWarp;
    uint16_t* dst = s_kv + (kStaged ? row0 : stage * kTile + row0) * kRowStride;
    unsigned char* staged = s_staging + static_cast<size_t>(stage * kTile + row0) * (kStaged ? Rows::kStagedRowBytes : 0);
    const unsigned visible = __ballot_sync(~0u, slot_lane >= 0);
    if (lane == 0) s_valid[stage * kWarps + warp] = static_cast<uint8_t>(visible & 0xffu);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t slot = __shfl_sync(~0u, slot_lane, r);
      Rows::copy_row(p.cache, slot, dst + r * kRowStride, staged + r * Rows::kStagedRowBytes, lane);
    }
  };

  // Both stages start streaming at once (a 4K row's split is two tiles); the slot of the third tile is looked up
  // a tile ahead of its copy. Staged: one commit group per tile, in order, so waiting for all but the newest group
  // is waiting for the current tile.
  if (tile_begin < tile_end) issue_rows(slot_of(tile_begin), 0);
  cp_async_commit();
  if (tile_begin + 1 < tile_end) issue_rows(slot_of(tile_begin + 1), 1);
  cp_async_commit();
  int64_t slot_next = slot_of(tile_begin + 2);

  // This warp's quarter of q as mma B fragments (k = dim, n = pair), bf16; padding pairs are zero.
  const int key_half = warp % 2, quarter = warp / 2;
  uint32_t qf[kQuarterSteps][kN][2];
#pragma unroll
  for (int ks = 0; ks < kQuarterSteps; ++ks)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt) {
      const int pair = nt * 8 + g;
      if (pair < n_pairs) {
        const float* src = p.q + (pair_base + pair) * kRow + quarter * kQuarterDims + ks * 16 + 2 * c;
        const float2 lo = *reinterpret_cast<const float2*>(src), hi = *reinterpret_cast<const float2*>(src + 8);
        qf[ks][nt][0] = pack_bf16x2(lo.x, lo.y);
        qf[ks][nt][1] = pack_bf16x2(hi.x, hi.y);
      } else {
        qf[ks][nt][0] = qf[ks][nt][1] = 0u;
      }
    }

  // Softmax: threads 8i .. 8i+7 own pair i (keys 8j .. 8j+7 of each tile for thread 8i + j) and keep its running
  // max and sum in registers (every thread of the pair holds the same values).
  const int sm_pair = tid / kSoftmaxThreads, sm_part = tid % kSoftmaxThreads;
  const bool sm_active = sm_pair < kPairs;  // whole warps: 8·kN pairs of 8 threads
  const int64_t sm_keys = sm_pair >= n_pairs ? 0
                          : selected         ? INT64_MAX
                                             : p.kv_len[first_row + (m0 + sm_pair) / heads];
  float sm_m = -INFINITY, sm_l = 0.f;

  float acc_o[4][kN][4];  // this warp's 64 output dims (4 m16 tiles) × the pairs
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc_o[mt][nt][k] = 0.f;

  const float score_scale = p.scale * kLog2e;  // softmax in base 2
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = static_cast<int>((tile - tile_begin) & 1);
    const uint16_t* kv;
    int valid_slot = stage;  // where this tile's visibility bytes are
    if constexpr (kStaged) {
      cp_async_wait<1>();
      __syncthreads();  // this tile's raw rows are visible; the previous tile's bf16 tile, s_part and P are free
      Rows::widen(s_staging + static_cast<size_t>(stage) * kTile * Rows::kStagedRowBytes, s_kv, kRowStride, tid,
                  kThreads);
      if (tid < kWarps) s_valid[2 * kWarps + tid] = s_valid[stage * kWarps + tid];
      valid_slot = 2;
      __syncthreads();  // the bf16 tile is complete; its raw stage is free for the tile after next
      if (tile + 2 < tile_end) issue_rows(slot_next, stage);
      cp_async_commit();
      slot_next = slot_of(tile + 3);
      kv = s_kv;
    } else {
      if (tile == tile_begin)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
      __syncthreads();  // this tile is visible to every warp; the previous tile's stage, s_part and P are free
      if (tile > tile_begin && tile + 1 < tile_end) {
        issue_rows(slot_next, stage ^ 1);
        cp_async_commit();
        slot_next = slot_of(tile + 2);
      }
      kv = s_kv + stage * kTile * kRowStride;
    }

    // Partial scores S[key, pair] over this warp's keys and quarter of the dims: A = K (ldmatrix.x4 per m16 ×
    // k16), B = q from registers.
    {
      float acc_s[2][kN][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc_s[mt][nt][k] = 0.f;
      const uint16_t* k_src =
          kv + (key_half * 32 + lane % 8 + ((lane / 8) % 2) * 8) * kRowStride + quarter * kQuarterDims + (lane / 16) * 8;
#pragma unroll
      for (int ks = 0; ks < kQuarterSteps; ++ks)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t a[4];
          ldmatrix_x4(a, k_src + mt * 16 * kRowStride + ks * 16);
#pragma unroll
          for (int nt = 0; nt < kN; ++nt) mma_bf16_16816(acc_s[mt][nt], a, qf[ks][nt][0], qf[ks][nt][1]);
        }
      store_score_partials<kN, kPartStride>(s_part + quarter * kPairs * kPartStride, acc_s, key_half * 32, g, c);
    }
    __syncthreads();

    // Online softmax over the tile: the four quarters summed in a fixed order, masked, exponentiated in base 2.
    if (sm_active) {
      float s[8];
      {
        const float* src = s_part + sm_pair * kPartStride + sm_part * 8;
        const float4 a = *reinterpret_cast<const float4*>(src), b = *reinterpret_cast<const float4*>(src + 4);
        s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w, s[4] = b.x, s[5] = b.y, s[6] = b.z, s[7] = b.w;
#pragma unroll
        for (int q = 1; q < kDimQuarters; ++q) {
          const float* qs = src + q * kPairs * kPartStride;
          const float4 x = *reinterpret_cast<const float4*>(qs), y = *reinterpret_cast<const float4*>(qs + 4);
          s[0] += x.x, s[1] += x.y, s[2] += x.z, s[3] += x.w, s[4] += y.x, s[5] += y.y, s[6] += y.z, s[7] += y.w;
        }
      }
      const unsigned visible = s_valid[valid_slot * kWarps + sm_part];
      const int64_t key0 = tile * kTile + sm_part * 8;  // key index of s[0] (its position when dense)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] = (visible >> j & 1u) && key0 + j < sm_keys ? s[j] * score_scale : -INFINITY;
      float e[8];
      const float alpha = online_softmax_step<8, kSoftmaxThreads>(s, e, sm_m, sm_l);
      *reinterpret_cast<uint4*>(s_p + sm_pair * kPStride + sm_part * 8) =
          make_uint4(pack_bf16x2(e[0], e[1]), pack_bf16x2(e[2], e[3]), pack_bf16x2(e[4], e[5]), pack_bf16x2(e[6], e[7]));
      if (sm_part == 0) s_alpha[sm_pair] = alpha;
    }
    __syncthreads();

    // Values: O[dim, pair] += V[key, dim]ᵀ · P[pair, key]ᵀ; warp w owns latent dims 64w..64w+63 (A = V through
    // ldmatrix.trans), P's fragments from shared memory.
    {
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const float a0 = s_alpha[nt * 8 + 2 * c], a1 = s_alpha[nt * 8 + 2 * c + 1];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          acc_o[mt][nt][0] *= a0;
          acc_o[mt][nt][1] *= a1;
          acc_o[mt][nt][2] *= a0;
          acc_o[mt][nt][3] *= a1;
        }
      }
      const uint16_t* v_src = kv + (lane % 8 + (lane / 16) * 8) * kRowStride + warp * 64 + ((lane / 8) % 2) * 8;
      const uint16_t* p_src = s_p + (lane % 8) * kPStride + (lane / 8) * 8;
#pragma unroll
      for (int kb = 0; kb < kTile / 32; ++kb) {
        uint32_t pb[kN][4];  // keys 32kb .. 32kb+31: [0], [1] the first k16 step, [2], [3] the second
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) ldmatrix_x4(pb[nt], p_src + nt * 8 * kPStride + kb * 32);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            uint32_t va[4];
            ldmatrix_x4_trans(va, v_src + (kb * 32 + kk * 16) * kRowStride + mt * 16);
#pragma unroll
            for (int nt = 0; nt < kN; ++nt) mma_bf16_16816(acc_o[mt][nt], va, pb[nt][2 * kk], pb[nt][2 * kk + 1]);
          }
      }
    }
  }
  cp_async_wait<0>();
  if (sm_active && sm_part == 0) {
    s_l[sm_pair] = sm_l;
    s_m[sm_pair] = sm_m;
  }
  __syncthreads();  // s_l / s_m final; every warp is done with the KV stages, which now stage the output

  // Normalised output (or this split's normalised partial plus its log-sum-exp, natural log), staged as
  // [pair][dim] fp32 so that the global stores are whole 16-byte pieces of each pair's row.
  float* s_out = reinterpret_cast<float*>(smem + L::kKv);
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) {
    const int pair = nt * 8 + 2 * c;
    const float l0 = s_l[pair], l1 = s_l[pair + 1];
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      float* d = s_out + pair * kOutStride + warp * 64 + mt * 16 + g;
      d[0] = acc_o[mt][nt][0] * inv0;
      d[kOutStride] = acc_o[mt][nt][1] * inv1;
      d[8] = acc_o[mt][nt][2] * inv0;
      d[kOutStride + 8] = acc_o[mt][nt][3] * inv1;
    }
  }
  __syncthreads();
  finish_splits<kMerge, kThreads>(p, s_out, s_l, s_m, n_pairs, pair_base, pairs, ctas, first_row, split, part_out,
                                  part_lse, sync, reinterpret_cast<float*>(smem + L::kKv), tid, [] { __syncthreads(); });
}

// n8 tiles per CTA for groups of up to `rows` rows: enough for the largest even share of a group's pairs (a
// smaller group's share is never larger, see the kernel's chunk).
inline int ntiles_for(int64_t rows, int64_t heads) {
  const int64_t pairs = rows * heads, ctas = mla_decode_ctas_per_group(rows, heads);
  return static_cast<int>(((pairs + ctas - 1) / ctas + 7) / 8);
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args... args) {
  return launch_with_pdl(kernel, grid, block, smem, stream, pdl, args...);
}

// KILN_MLA_SEPARATE_MERGE=1 keeps the merge in its own launch (an A/B switch for benchmarks; same bits).
inline bool separate_merge_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("KILN_MLA_SEPARATE_MERGE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return forced;
}

// Launches a decode kernel of this header's grid — (CTAs per row group, splits, row groups), kPairsPerCta (row,
// head) pairs a CTA, kBytes of dynamic shared memory, arguments (p, part_out, part_lse, sync) — as kMerging (the
// instantiation that merges its splits itself) when p.sync is set, there are kMlaKernelMergeMinSplits or more
// splits, at most kMlaSyncGroups row groups and a grid that fits on the device at once (all its CTAs resident
// together), else as kPlain. `merged` says which ran. The tensor-core template below and a layout's own kernel
// (fp8_ds_mla's direct one) share it.
template <auto kPlain, auto kMerging, size_t kBytes, int kPairsPerCta, int kThreadsT>
cudaError_t launch_decode_grid(const MlaDecodeParams& p, cudaStream_t stream, bool pdl, float* part_out,
                               float* part_lse, bool& merged) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(kPlain, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  if (attr != cudaSuccess) return attr;
  const int64_t rows = p.row_groups ? p.max_group_rows : 1;
  const int64_t pairs = rows * p.num_heads;
  const dim3 grid(static_cast<unsigned>((pairs + kPairsPerCta - 1) / kPairsPerCta), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.row_groups ? p.num_groups : p.num_queries));
  merged = false;
  if (p.sync != nullptr && p.num_splits >= kMlaKernelMergeMinSplits && grid.z <= kMlaSyncGroups &&
      !separate_merge_forced()) {
    static const int per_sm = [] {
      int n = 0;
      if (cudaFuncSetAttribute(kMerging, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes)) !=
          cudaSuccess)
        return 0;
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kMerging, kThreadsT, kBytes) == cudaSuccess ? n : 0;
    }();
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
      merged = static_cast<int64_t>(grid.x) * grid.y * grid.z <= static_cast<int64_t>(per_sm) * sms;
  }
  if (merged) return launch(kMerging, grid, dim3(kThreadsT), kBytes, stream, pdl, p, part_out, part_lse, p.sync);
  return launch(kPlain, grid, dim3(kThreadsT), kBytes, stream, pdl, p, part_out, part_lse,
                static_cast<unsigned*>(nullptr));
}

// The merge of the splits in its own launch, when the decode kernel did not merge them (one split: nothing to do).
inline cudaError_t launch_split_merge(const MlaDecodeParams& p, cudaStream_t stream, bool pdl, const float* part_out,
                                      const float* part_lse) {
  const int64_t rows = p.num_queries * p.num_heads;
  return launch(mla_decode_combine_kernel, dim3(static_cast<unsigned>(rows)), dim3(kCombineThreads), 0, stream, pdl,
                part_out, part_lse, rows, p.num_splits, p.out, p.out_bf16, p.out_lse);
}

template <int kN, class Rows>
cudaError_t launch_decode(const MlaDecodeParams& p, cudaStream_t stream, bool pdl, float* part_out, float* part_lse,
                          bool& merged) {
  return launch_decode_grid<mla_decode_tc_kernel<kN, Rows, false>, mla_decode_tc_kernel<kN, Rows, true>,
                            Smem<kN, Rows>::kBytes, 8 * kN, kThreads>(p, stream, pdl, part_out, part_lse, merged);
}

}  // namespace mla_tc

// Whether to launch with programmatic dependent launch: sm_90+ unless KILN_PDL=0 (the core's A/B switch).
inline bool mla_decode_pdl_default() { return pdl_supported_on_current_device(); }

// Queues the attention (and the merge of its splits) on `stream`. `RowsFor<kRope>` is the row source for rope width
// kRope (64 or 0, from p.rope_dim). Returns cudaSuccess, or the launch's error; mla_decode_check(p) must pass.
template <template <int> class RowsFor>
cudaError_t launch_mla_decode_tc(const MlaDecodeParams& p, cudaStream_t stream, bool pdl) {
  if (p.num_queries == 0) return cudaSuccess;
  const int64_t rows = p.num_queries * p.num_heads;
  float* part_out = static_cast<float*>(p.workspace);
  float* part_lse = p.num_splits > 1 ? part_out + static_cast<int64_t>(p.num_splits) * rows * kMlaLatentDim : nullptr;
  const int ntiles = mla_tc::ntiles_for(p.row_groups ? p.max_group_rows : 1, p.num_heads);
  const bool nope = p.rope_dim == 0;
  using namespace mla_tc;
  bool merged = false;
  const cudaError_t e =
      ntiles == 1   ? (nope ? launch_decode<1, RowsFor<0>>(p, stream, pdl, part_out, part_lse, merged)
                            : launch_decode<1, RowsFor<64>>(p, stream, pdl, part_out, part_lse, merged))
      : ntiles == 2 ? (nope ? launch_decode<2, RowsFor<0>>(p, stream, pdl, part_out, part_lse, merged)
                            : launch_decode<2, RowsFor<64>>(p, stream, pdl, part_out, part_lse, merged))
      : ntiles == 3 ? (nope ? launch_decode<3, RowsFor<0>>(p, stream, pdl, part_out, part_lse, merged)
                            : launch_decode<3, RowsFor<64>>(p, stream, pdl, part_out, part_lse, merged))
                    : (nope ? launch_decode<4, RowsFor<0>>(p, stream, pdl, part_out, part_lse, merged)
                            : launch_decode<4, RowsFor<64>>(p, stream, pdl, part_out, part_lse, merged));
  if (e != cudaSuccess || p.num_splits == 1 || merged) return e;
  return launch_split_merge(p, stream, pdl, part_out, part_lse);
}

}  // namespace
}  // namespace kiln::cuda

// The EXL3 kernels (see exl3_kernels.h for the pipeline and why it is shaped so).
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "exl3_codebook_device.cuh"
#include "exl3_kernels.h"
#include "exl3_lane_states.h"
#include "kiln/cuda/pdl_launch.cuh"
#include "kiln/cuda/warp_mma.cuh"

namespace kiln::exl3::cuda {
namespace {

namespace cg = cooperative_groups;
using kiln::cuda::mma_f16_16816;
using kiln::cuda::pdl_launch_dependents;
using kiln::cuda::pdl_wait;

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The routing ids are read through L2 (ld.global.cg): with ProductArgs::routing_before_wait they are read before the
// launch's pdl_wait, and L2 is where a completed kernel's writes are.
template <class T>
__device__ __forceinline__ const T* pick(const PerRow<T>& p, int64_t row) {
  return p.fixed ? p.fixed : p.table[__ldcg(p.ids + static_cast<int>(row) / p.ids_div)];  // 32-bit: rows < 2^31
}

// The 128-point Sylvester butterflies over one 128-vector held by a warp, lane L holding elements 4L .. 4L+3, then
// × scale: stages h = 1, 2 inside the lane, h = 4 .. 64 across lanes L ^ h/4. Each element sees the CPU reference's
// operations in its order (hadamard128 in exl3_tile.cpp: the lower index gets a + b, the upper a − b), so results
// agree bit for bit — with no shared memory and no block barrier.
__device__ __forceinline__ void hadamard128_warp(float (&v)[4], float scale) {
  float a = v[0], b = v[1];
  v[0] = __fadd_rn(a, b), v[1] = __fsub_rn(a, b);
  a = v[2], b = v[3];
  v[2] = __fadd_rn(a, b), v[3] = __fsub_rn(a, b);
  a = v[0], b = v[2];
  v[0] = __fadd_rn(a, b), v[2] = __fsub_rn(a, b);
  a = v[1], b = v[3];
  v[1] = __fadd_rn(a, b), v[3] = __fsub_rn(a, b);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool upper = lane & m;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = __shfl_xor_sync(0xFFFFFFFFu, v[e], m);
      v[e] = upper ? __fsub_rn(p, v[e]) : __fadd_rn(v[e], p);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = __fmul_rn(v[e], scale);
}

// State q of the lane from its window shifted left by its bit offset: (s0 : s1 : s2) holds the lane's states from
// bit 0, state q ending at bit 16 + q·K (≤ 72). Same bits as lane_state (exl3_lane_states.h), with constant shifts.
template <int K, int Q>
__device__ __forceinline__ uint32_t normalized_state(uint32_t s0, uint32_t s1, uint32_t s2) {
  constexpr int e = 16 + Q * K;
  if constexpr (e <= 32) return (s0 >> (32 - e)) & 0xFFFFu;
  else if constexpr (e <= 64) return __funnelshift_r(s1, s0, 64 - e) & 0xFFFFu;
  else return __funnelshift_r(s2, s1, 96 - e) & 0xFFFFu;
}

// a / b for 0 ≤ a < 2^20, 1 ≤ b ≤ 2^10 through fp32 (a handful of instructions instead of the ~20 of an integer
// division by a runtime value): the correctly rounded quotient is within half an ulp of a / b, and a / b is either an
// integer (exact) or at least 1/b away from the next one, far more than an ulp, so truncation gives the floor.
__device__ __forceinline__ int small_div(int a, int b) {
  return __float2int_rz(__fdiv_rn(static_cast<float>(a), static_cast<float>(b)));
}

// (x & m) ^ c in one LOP3: written out because the compiler splits the two immediates into two instructions.
__device__ __forceinline__ uint32_t and_xor(uint32_t x, uint32_t m, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(x), "r"(m), "r"(c));
  return d;
}

// Two states → their codebook values as one half2 (the first in the low half): the B-fragment register of two
// consecutive k. 3INST/MCG: both masked products, then one fp16 add of their halves (the same single rounding as
// decode_state_half); MUL1 through decode_state_half.
template <int CB>
__device__ __forceinline__ uint32_t decode_pair(uint32_t s0, uint32_t s1) {
  if constexpr (CB == kCbMul1) {
    const __half2 h = __halves2half2(decode_state_half(s0, CB), decode_state_half(s1, CB));
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    uint32_t x0 = CB == kCbMcg ? s0 * 0xCBAC1FEDu : s0 * 89226354u + 64248484u;
    uint32_t x1 = CB == kCbMcg ? s1 * 0xCBAC1FEDu : s1 * 89226354u + 64248484u;
    x0 = and_xor(x0, 0x8FFF8FFFu, 0x3B603B60u);
    x1 = and_xor(x1, 0x8FFF8FFFu, 0x3B603B60u);
    const uint32_t lows = __byte_perm(x0, x1, 0x5410), highs = __byte_perm(x0, x1, 0x7632);
    const __half2 h = __hadd2(*reinterpret_cast<const __half2*>(&lows), *reinterpret_cast<const __half2*>(&highs));
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The lane's four B-fragment registers of one tile from its stream words (tw[first], tw[first + 1], ...): the states
// 0..7 decoded in pairs. K = 4 (the seeds' most used K) has its own cut: there every lane's window starts 20 bits into
// its first word, so the 8 states are the 16-bit fields of V = w0:w1 (w0 high) ending 28, 24, .., 0 bits above V's
// bit 0 — two words, no window normalisation, and four of the fields are a byte permutation or a half-word shift
// (one instruction each instead of a shift and a mask): 13 instructions a tile for the states instead of 19.
template <int K, int CB>
__device__ __forceinline__ void lane_fragments(const uint32_t* tw, int first, int first1, int first2, int off,
                                               uint32_t (&b)[4]) {
  if constexpr (K == 4) {
    const uint32_t w0 = tw[first], w1 = tw[first1];
    const uint32_t u = __funnelshift_r(w1, w0, 4);  // V >> 4
    const uint32_t s0 = __funnelshift_r(w1, w0, 28) & 0xFFFFu, s1 = __funnelshift_r(w1, w0, 24) & 0xFFFFu;
    const uint32_t s2 = u >> 16, s3 = w1 >> 16;
    const uint32_t s4 = __byte_perm(u, 0u, 0x4421), s5 = __byte_perm(w1, 0u, 0x4421);
    const uint32_t s6 = u & 0xFFFFu, s7 = w1 & 0xFFFFu;
    b[0] = decode_pair<CB>(s0, s1), b[1] = decode_pair<CB>(s2, s3);
    b[2] = decode_pair<CB>(s4, s5), b[3] = decode_pair<CB>(s6, s7);
  } else {
    const uint32_t w0 = tw[first], w1 = tw[first1], w2 = tw[first2];
    const uint32_t s0 = __funnelshift_l(w1, w0, off), s1 = __funnelshift_l(w2, w1, off), s2 = w2 << off;
    b[0] = decode_pair<CB>(normalized_state<K, 0>(s0, s1, s2), normalized_state<K, 1>(s0, s1, s2));
    b[1] = decode_pair<CB>(normalized_state<K, 2>(s0, s1, s2), normalized_state<K, 3>(s0, s1, s2));
    b[2] = decode_pair<CB>(normalized_state<K, 4>(s0, s1, s2), normalized_state<K, 5>(s0, s1, s2));
    b[3] = decode_pair<CB>(normalized_state<K, 6>(s0, s1, s2), normalized_state<K, 7>(s0, s1, s2));
  }
}

// The cluster barrier in halves (sm_90): arrive (relaxed, or releasing this thread's shared-memory writes to the
// cluster) and wait (acquiring the others').
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// fp32 → (hi, lo) fp16 with hi + lo = x to about 2^-22 relative: the tensor cores see x in two fp16 parts and the
// product keeps fp32 accuracy. |x| is clamped to fp16's largest finite value first (rotated activations beyond
// 65504 would otherwise become inf; see exl3_kernels.h).
__device__ __forceinline__ void split_half(float x, __half& hi, __half& lo) {
  x = fminf(fmaxf(x, -65504.0f), 65504.0f);
  hi = __float2half_rn(x);
  lo = __float2half_rn(__fsub_rn(x, __half2float(hi)));
}

__device__ __forceinline__ uint32_t pack_halves(__half a, __half b) {
  const __half2 h = __halves2half2(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

constexpr int kGroupTiles = kHadamardSize / 16;  // a block's column tiles, one output rotation
constexpr int kWarps = kGroupTiles;                 // one per column tile
constexpr int kProductThreads = 32 * kWarps;
constexpr int kChunk = 4;                           // tiles per cp.async commit group
constexpr int kRing = 4;                            // chunks in flight per warp (16 tiles: all of a small split)
constexpr int kRowPad = 8;  // words after each row's input slice: the rows of an A-fragment load land 8 banks apart

// 4 blocks an SM (≤ 64 registers, as the kernel took before ProductArgs::routing_before_wait): uncapped, the early
// prologue grew it to 70–85 registers, and GLM-5.3-Flash's expert launches (several waves) ran 23–30 % slower at 2–3
// blocks an SM (H100, 2026-12-06).
template <int K, int CB>
__global__ void __launch_bounds__(kProductThreads, 4) trellis_product_kernel(ProductArgs a, int rows_per_block) {
  constexpr int kWords = 8 * K;
  // xs: per row of this block, the rotated input slice as interleaved (hi, lo) half2 words: word 2p holds the fp16
  // hi parts of inputs 2p, 2p + 1, word 2p + 1 their lo parts — so one 8-byte load is a lane's A-fragment pair.
  // sums: [splits][rows_per_block][128] after xs, used in the cluster's rank-0 block: every split's sums land there.
  extern __shared__ __align__(16) uint32_t xs[];
  cg::cluster_group cluster = cg::this_cluster();
  // Arrive now, wait before the first access to another block's shared memory (every block of the cluster must have
  // started): by then all have long arrived, so the wait costs nothing.
  cluster_arrive_relaxed();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.x, splits = gridDim.x;
  // Column group blockIdx.y of the parts' groups laid end to end.
  int group = blockIdx.y, pi = 0;
#pragma unroll
  for (int p = 0; p + 1 < kMaxParts; ++p) {
    const int groups = static_cast<int>(a.part[pi].n_pad / kHadamardSize);
    if (pi + 1 < a.parts && group >= groups) group -= groups, ++pi;
  }
  const ProductPart& P = a.part[pi];
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * rows_per_block;  // local
  const int rows = static_cast<int>(a.rows - row0 < rows_per_block ? a.rows - row0 : rows_per_block);
  // Index arithmetic in 32 bits (shapes are far below 2^31; a 64-bit division is a long software routine).
  const int k_blocks = static_cast<int>(a.k_pad / kHadamardSize), n_tiles = static_cast<int>(P.n_pad / 16);
  // Split s takes 128-input blocks [s·k_blocks/S, (s+1)·k_blocks/S): sizes differ by at most one, none empty.
  const int b_begin = small_div(split * k_blocks, splits), b_end = small_div((split + 1) * k_blocks, splits);
  const int i_begin = b_begin * kGroupTiles, i_end = b_end * kGroupTiles;
  const int len = (i_end - i_begin) * 16;
  const int stride = (k_blocks + splits - 1) / splits * kHadamardSize + kRowPad;
  const int j = group * kGroupTiles + warp;
  const int chunks = (i_end - i_begin) / kChunk;  // whole: a 128-input block is 8 tiles
  const int64_t q0 = a.row_begin + row0;  // global row of local row 0
  const int vblocks = len / kHadamardSize;

  // 1. Weights first: each warp streams its column tile's k range through a ring of kRing chunks in shared memory
  // (cp.async, 16 bytes a lane), so a warp has kRing·kChunk tiles in flight without holding them in registers and a
  // block asks for all of a small matrix at once. A Linear's trellis is read-only for the whole run, so with
  // programmatic dependent launch its copies go out before pdl_wait(), while the kernel before this one finishes
  // (pdl.cuh's contract). An expert set's pointers come through routing ids an earlier kernel writes, so its copies
  // wait.
  const uint32_t* trellis = P.trellis.fixed;
  uint32_t* ring = xs + rows_per_block * (stride + splits * kHadamardSize) + warp * (kRing * kChunk * kWords);
  // Tile i_begin + n of this warp's column at tiles + n·step (32-bit offsets: a module's trellis is far below 2^31
  // words, and the address arithmetic stays one instruction per copy).
  const uint32_t* tiles = nullptr;
  const uint32_t step = static_cast<uint32_t>(n_tiles * kWords);
  auto issue_chunk = [&](int c) {  // chunk c into ring slot c % kRing; always one commit group, empty past the end
    if (c < chunks) {
      uint32_t* dst = ring + (c % kRing) * (kChunk * kWords);
      constexpr int kPieces = kChunk * kWords / 4, kPerTile = kWords / 4;  // 16-byte pieces
#pragma unroll
      for (int it = 0; it < (kPieces + 31) / 32; ++it) {
        const int p = it * 32 + lane;
        if (kPieces % 32 == 0 || p < kPieces) {
          const int u = p / kPerTile, w = p % kPerTile;
          kiln::cuda::cp_async_16(dst + u * kWords + 4 * w,
                                  tiles + static_cast<uint32_t>(c * kChunk + u) * step + 4 * w, true);
        }
      }
    }
    kiln::cuda::cp_async_commit();
  };
  auto set_tiles = [&] { tiles = trellis + (static_cast<int64_t>(i_begin) * n_tiles + j) * kWords; };
  auto issue_first_chunks = [&] {
#pragma unroll
    for (int c = 0; c < kRing; ++c) issue_chunk(c);
  };
  float suh_first[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // this warp's first input vector's suh (one per lane element)
  auto load_suh_first = [&](const float* suh) {
    if (warp >= rows * vblocks) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = i_begin * 16 + (warp - small_div(warp, vblocks) * vblocks) * kHadamardSize + 4 * lane + e;
      if (k < a.in) suh_first[e] = __ldg(suh + k);
    }
  };
  if (trellis) {  // a branch, so ptxas keeps these loads ahead of the wait (see skinny_gemm.cu in the core)
    set_tiles();
    issue_first_chunks();
    if (P.suh.fixed) load_suh_first(P.suh.fixed);
  } else if (a.routing_before_wait) {  // the routing chain (ids → table → trellis) overlaps the previous kernel
    trellis = pick(P.trellis, q0);
    set_tiles();
    issue_first_chunks();
    if (warp < rows * vblocks) load_suh_first(pick(P.suh, q0 + small_div(warp, vblocks)));  // rows past the last: no id
  }
  // Local row r's input values of its 128-block vb of this split, before ⊙ suh: bf16 x, or the SwiGLU of an expert's
  // gate and up outputs as the CPU computes it (0 past `in`).
  auto input_vector = [&](int r, int vb, float (&x)[4]) {
    const int64_t q = q0 + r;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = i_begin * 16 + vb * kHadamardSize + 4 * lane + e;
      float val = 0.0f;
      if (k < a.in) {
        if (a.gate) {
          const float g = fminf(a.gate[q * a.in + k], a.swiglu_limit);
          const float u = fminf(fmaxf(a.up[q * a.in + k], -a.swiglu_limit), a.swiglu_limit);
          val = g / (1.0f + expf(-g)) * u;
        } else {
          val = __bfloat162float(
              __ushort_as_bfloat16(a.x_bf16[small_div(static_cast<int>(q), a.x_div) * a.x_stride + k]));
        }
      }
      x[e] = val;
    }
  };
  pdl_wait();
  pdl_launch_dependents();
  // The warp's first input vector is read first: it is what the block barrier below waits for, and it needs no
  // routing lookup (an expert set's trellis and suh pointers come through ids and a table: two dependent loads).
  float x_first[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (warp < rows * vblocks) input_vector(small_div(warp, vblocks), warp - small_div(warp, vblocks) * vblocks, x_first);
  if (!trellis) {
    trellis = pick(P.trellis, q0);
    set_tiles();
    issue_first_chunks();
  }
  if (!P.suh.fixed && !a.routing_before_wait && warp < rows * vblocks)
    load_suh_first(pick(P.suh, q0 + small_div(warp, vblocks)));
  // The epilogue's row (one per warp at most: rows ≤ 8) and its scales, loaded now so they arrive during the work.
  const int er = split == 0 ? warp : kMaxRowsPerBlock;  // rank 0's warp w finishes row w (rows ≤ 8 = warps)
  float svh_e[4] = {0.0f, 0.0f, 0.0f, 0.0f}, bias_e[4] = {0.0f, 0.0f, 0.0f, 0.0f}, weight_e = 1.0f;
  if (er < rows) {
    const float* svh = pick(P.svh, q0 + er);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t col = static_cast<int64_t>(group) * kHadamardSize + 4 * lane + e;
      if (col < P.out) {
        svh_e[e] = __ldg(svh + col);
        if (P.bias) bias_e[e] = __ldg(P.bias + col);
      }
    }
    if (a.row_weight) weight_e = __ldcg(a.row_weight + q0 + er);
  }

  // Each warp rotates whole (row, 128-block) vectors of the slice: x ⊙ suh (or the SwiGLU of an expert's gate and
  // up outputs, as the CPU computes it), the butterflies, then the (hi, lo) split.
  for (int v = warp; v < rows * vblocks; v += kWarps) {
    const int r = small_div(v, vblocks), vb = v - r * vblocks;
    float x[4];
    if (v == warp) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = __fmul_rn(x_first[e], suh_first[e]);
    } else {
      const float* suh = pick(P.suh, q0 + r);
      input_vector(r, vb, x);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = i_begin * 16 + vb * kHadamardSize + 4 * lane + e;
        x[e] = k < a.in ? __fmul_rn(x[e], suh[k]) : 0.0f;
      }
    }
    hadamard128_warp(x, a.hadamard_scale);
    __half h[4], l[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) split_half(x[e], h[e], l[e]);
    *reinterpret_cast<uint4*>(xs + r * stride + vb * kHadamardSize + 4 * lane) =
        make_uint4(pack_halves(h[0], h[1]), pack_halves(l[0], l[1]), pack_halves(h[2], h[3]), pack_halves(l[2], l[3]));
  }
  __syncthreads();

  // 2. Decode and multiply on the tensor cores: A rows 0..7 are the block's rows' hi parts, rows 8..15 their lo
  // parts (lane g = lane/4 holds both for row g), B the tile's two 16×8 halves decoded in registers.
  const int g = lane >> 2, t = lane & 3;
  const int first = lane_first_word(lane, K), off = lane_window_bit(lane, K) % 32;
  float acc[2][2][4] = {};  // [even/odd tile][column half]: two independent accumulator chains
  // Lanes past the block's rows read the last row: their A rows only feed C rows nobody reads, and the load needs
  // no predicate.
  const uint32_t* xrow = xs + min(g, rows - 1) * stride + 2 * t;
  const int first1 = (first + 1) % kWords, first2 = (first + 2) % kWords;
  for (int c = 0; c < chunks; ++c) {
    const int i = i_begin + c * kChunk;
    kiln::cuda::cp_async_wait<kRing - 1>();  // this lane's copies of chunk c have landed
    __syncwarp();                             // and the other lanes' (the warp reads each other's pieces)
    const uint32_t* slot = ring + (c % kRing) * (kChunk * kWords);
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      uint32_t b[4];
      lane_fragments<K, CB>(slot + u * kWords, first, first1, first2, off, b);
      const uint32_t* xa = xrow + (i + u - i_begin) * 16;
      const uint2 p = *reinterpret_cast<const uint2*>(xa), r = *reinterpret_cast<const uint2*>(xa + 8);
      const uint32_t fa[4] = {p.x, p.y, r.x, r.y};
      mma_f16_16816(acc[u & 1][0], fa, b[0], b[1]);
      mma_f16_16816(acc[u & 1][1], fa, b[2], b[3]);
    }
    __syncwarp();  // every lane has read the slot before it is refilled
    issue_chunk(c + kRing);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][h][e] = __fadd_rn(acc[0][h][e], acc[1][h][e]);
  // Row g's sums (its hi part's C row g plus its lo part's C row g + 8, columns 2t, 2t + 1 of each half) go
  // straight into the rank-0 block's shared memory at [split][g]; then this block arrives and, unless it is rank 0,
  // exits: no block waits for the epilogue, and rank 0 reads only its own shared memory.
  const int col0 = warp * 16 + 2 * t;
  cluster_wait();
  float* sums = reinterpret_cast<float*>(xs + rows_per_block * stride);
  if (g < rows) {
    float* dst = cluster.map_shared_rank(sums, 0) + (split * rows_per_block + g) * kHadamardSize + col0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(dst + h * 8) =
          make_float2(__fadd_rn(acc[0][h][0], acc[0][h][2]), __fadd_rn(acc[0][h][1], acc[0][h][3]));
  }
  cluster_arrive_release();
  if (split != 0) return;
  cluster_wait();

  // 3. Rank 0, one warp per row: the splits' sums in split order, the rotation of the 128 outputs, ⊙ svh, + bias,
  // × a per-row weight, stored as bf16 or fp32 (or added).
  if (er < rows) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < splits; ++s) {
      const float4 p = *reinterpret_cast<const float4*>(sums + (s * rows_per_block + er) * kHadamardSize + 4 * lane);
      v[0] = __fadd_rn(v[0], p.x), v[1] = __fadd_rn(v[1], p.y), v[2] = __fadd_rn(v[2], p.z), v[3] = __fadd_rn(v[3], p.w);
    }
    hadamard128_warp(v, a.hadamard_scale);
    const int64_t q = q0 + er;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t col = static_cast<int64_t>(group) * kHadamardSize + 4 * lane + e;
      if (col >= P.out) continue;
      float o = __fmul_rn(v[e], svh_e[e]);
      if (P.bias) o = __fadd_rn(o, bias_e[e]);
      if (a.row_weight) o = __fmul_rn(weight_e, o);
      const int64_t at = q * P.y_stride + P.col_offset + col;
      if (a.y_bf16) {
        auto* y = static_cast<__nv_bfloat16*>(P.y);
        y[at] = __float2bfloat16_rn(a.accumulate ? __bfloat162float(y[at]) + o : o);
      } else {
        auto* y = static_cast<float*>(P.y);
        y[at] = a.accumulate ? y[at] + o : o;
      }
    }
  }
}

// Programmatic dependent launch where the device has it (KILN_PDL=0 turns it off, as for the core's kernels).
bool use_pdl() {
  static const bool on = kiln::cuda::pdl_supported_on_current_device();
  return on;
}

template <int K, int CB>
const char* launch_product_kc(const ProductArgs& a, int rows_per_block, cudaStream_t st) {
  const int64_t k_blocks = a.k_pad / kHadamardSize;
  const int splits = a.splits;
  if (splits < 1 || splits > kMaxSplits || splits > k_blocks) return "trellis_product: bad split count";
  const int stride = static_cast<int>((k_blocks + splits - 1) / splits) * kHadamardSize + kRowPad;
  const size_t smem = (static_cast<size_t>(rows_per_block) * (stride + splits * kHadamardSize) +
                      static_cast<size_t>(kWarps) * kRing * kChunk * 8 * K) * sizeof(uint32_t);
  auto* kernel = trellis_product_kernel<K, CB>;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  cudaLaunchConfig_t cfg = {};
  int64_t groups = 0;
  for (int p = 0; p < a.parts; ++p) groups += a.part[p].n_pad / kHadamardSize;
  cfg.gridDim = dim3(static_cast<unsigned>(splits), static_cast<unsigned>(groups),
                     static_cast<unsigned>((a.rows + rows_per_block - 1) / rows_per_block));
  cfg.blockDim = dim3(kProductThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = use_pdl() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, a, rows_per_block);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return launched();
}

template <int K>
const char* launch_product_k(const ProductArgs& a, int rows_per_block, cudaStream_t st) {
  switch (a.codebook) {
    case kCb3Inst: return launch_product_kc<K, kCb3Inst>(a, rows_per_block, st);
    case kCbMcg: return launch_product_kc<K, kCbMcg>(a, rows_per_block, st);
    case kCbMul1: return launch_product_kc<K, kCbMul1>(a, rows_per_block, st);
  }
  return "unknown EXL3 codebook";
}

__global__ void dense_gemv_kernel(const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out,
                                  const float* bias, void* y, bool y_bf16, int64_t y_stride, int64_t col_offset,
                                  bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t o = static_cast<int64_t>(blockIdx.y) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int64_t q = blockIdx.x;
  if (o >= out) return;
  const __nv_bfloat16* xr = x + q * in;
  const __nv_bfloat16* wr = w + o * in;
  float acc = 0.0f;
  for (int64_t i = lane; i < in; i += 32) acc = fmaf(__bfloat162float(xr[i]), __bfloat162float(wr[i]), acc);
  for (int h = 16; h > 0; h /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, h);
  if (lane != 0) return;
  if (bias) acc += bias[o];
  const int64_t at = q * y_stride + col_offset + o;
  if (y_bf16) {
    auto* yy = static_cast<__nv_bfloat16*>(y);
    yy[at] = __float2bfloat16_rn(accumulate ? __bfloat162float(yy[at]) + acc : acc);
  } else {
    auto* yy = static_cast<float*>(y);
    yy[at] = accumulate ? yy[at] + acc : acc;
  }
}

// Decodes the tiles of a [16·rows_of_tiles, 16·cols_of_tiles] region of Ŵ starting at tile (ti0, tj0) into `dst`
// (row length ld): one warp per tile.
__device__ void decode_tiles_to(const uint32_t* trellis, int bits, int cb, int64_t n_tiles, int64_t ti0, int64_t tj0,
                                int tiles_r, int tiles_c, float* dst, int64_t ld) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int words = 8 * bits;
  const int first = lane_first_word(lane, bits);
  const int r0 = 2 * (lane & 3), c0 = lane >> 2;
  for (int t = warp; t < tiles_r * tiles_c; t += warps) {
    const int tr = t / tiles_c, tc = t % tiles_c;
    const uint32_t* tile = trellis + ((ti0 + tr) * n_tiles + tj0 + tc) * words;
    const uint32_t w0 = tile[first], w1 = tile[(first + 1) % words], w2 = tile[(first + 2) % words];
    const int rr[8] = {r0, r0 + 1, r0 + 8, r0 + 9, r0, r0 + 1, r0 + 8, r0 + 9};
    const int cc[8] = {c0, c0, c0, c0, c0 + 8, c0 + 8, c0 + 8, c0 + 8};
#pragma unroll
    for (int qq = 0; qq < 8; ++qq)
      dst[(tr * 16 + rr[qq]) * ld + tc * 16 + cc[qq]] = decode_state(lane_state(w0, w1, w2, lane, qq, bits), cb);
  }
}

__global__ void decode_matrix_kernel(const uint32_t* trellis, int bits, int cb, int64_t n_pad, float* w) {
  // One block per 16×128 strip: row tile blockIdx.x, column tiles 8·blockIdx.y ...
  const int64_t n_tiles = n_pad / 16;
  const int tiles_c = static_cast<int>(n_tiles - 8 * static_cast<int64_t>(blockIdx.y) < 8 ? n_tiles - 8 * static_cast<int64_t>(blockIdx.y) : 8);
  decode_tiles_to(trellis, bits, cb, n_tiles, blockIdx.x, 8 * static_cast<int64_t>(blockIdx.y), 1, tiles_c,
                  w + static_cast<int64_t>(blockIdx.x) * 16 * n_pad + 128 * static_cast<int64_t>(blockIdx.y), n_pad);
}

constexpr int kLd = kHadamardSize + 1;  // padded row: the row pass reads a column of banks without conflicts

// One 128×128 block of Ŵ: decode, Hb· (columns), ·Hb (rows), each butterfly followed by × scale as on the CPU, then
// suh[i]·w·svh[o] transposed into dst.
__global__ void dequantize_kernel(const uint32_t* trellis, int bits, int cb, int64_t n_pad, int64_t in, int64_t out,
                                  const float* suh, const float* svh, float scale, void* dst, bool dst_bf16,
                                  int64_t row_offset) {
  extern __shared__ float blk[];  // [128][kLd]
  const int64_t bi = blockIdx.x, bo = blockIdx.y;
  decode_tiles_to(trellis, bits, cb, n_pad / 16, bi * 8, bo * 8, 8, 8, blk, kLd);
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kHadamardSize) {  // column t
    for (int h = 1; h < kHadamardSize; h *= 2)
      for (int i = 0; i < kHadamardSize; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = blk[j * kLd + t], b = blk[(j + h) * kLd + t];
          blk[j * kLd + t] = __fadd_rn(a, b);
          blk[(j + h) * kLd + t] = __fsub_rn(a, b);
        }
    for (int i = 0; i < kHadamardSize; ++i) blk[i * kLd + t] = __fmul_rn(blk[i * kLd + t], scale);
  }
  __syncthreads();
  if (t < kHadamardSize) {  // row t
    float* v = blk + t * kLd;
    for (int h = 1; h < kHadamardSize; h *= 2)
      for (int i = 0; i < kHadamardSize; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = __fadd_rn(a, b);
          v[j + h] = __fsub_rn(a, b);
        }
    for (int i = 0; i < kHadamardSize; ++i) v[i] = __fmul_rn(v[i], scale);
  }
  __syncthreads();
  // dst row o (output), column i (input): consecutive threads take consecutive inputs.
  for (int idx = t; idx < kHadamardSize * kHadamardSize; idx += blockDim.x) {
    const int lo = idx / kHadamardSize, li = idx % kHadamardSize;
    const int64_t o = bo * kHadamardSize + lo, i = bi * kHadamardSize + li;
    if (o >= out || i >= in) continue;
    const float value = __fmul_rn(__fmul_rn(suh[i], blk[li * kLd + lo]), svh[o]);
    const int64_t at = (row_offset + o) * in + i;
    if (dst_bf16)
      static_cast<__nv_bfloat16*>(dst)[at] = __float2bfloat16_rn(value);
    else
      static_cast<float*>(dst)[at] = value;
  }
}

__global__ void copy_dense_rows_kernel(const __nv_bfloat16* w, int64_t count, void* dst, bool dst_bf16, int64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (dst_bf16)
      static_cast<__nv_bfloat16*>(dst)[offset + i] = w[i];
    else
      static_cast<float*>(dst)[offset + i] = __bfloat162float(w[i]);
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_words_kernel(uint32_t* words, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    words[i] = static_cast<uint32_t>(splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull)));
}

__global__ void fill_random_signs_kernel(float* v, int64_t count, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    v[i] = (splitmix64(seed + static_cast<uint64_t>(i)) & 1u) ? -scale : scale;
}

unsigned grid_for(int64_t count, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((count + threads - 1) / threads, 65535));
}

}  // namespace

int product_splits(int64_t k_pad) { return static_cast<int>(std::clamp<int64_t>(k_pad / kHadamardSize, 1, kMaxSplits)); }

int expert_splits(int64_t k_pad) {
  // Four 128-input blocks (32 tiles a warp) per split: measured on the H200 (2026-12-03) against two and one, the
  // GLM-4.7-Flash expert layer at K4 took 33.6 µs against 38.9 and 39.2, GLM-5.3-Flash's 124.6 against 137.4.
  constexpr int64_t b = 4;
  return static_cast<int>(std::clamp<int64_t>((k_pad / kHadamardSize + b - 1) / b, 1, kMaxSplits));
}

const char* trellis_product(const ProductArgs& a, int rows_per_block, void* stream) {
  if (a.rows <= 0) return nullptr;
  if (a.rows > kMaxPassRows) return "trellis_product: more rows than one pass takes";
  if (a.parts < 1 || a.parts > kMaxParts) return "trellis_product: 1 to kMaxParts parts";
  if (rows_per_block != 1 && rows_per_block != 4 && rows_per_block != kMaxRowsPerBlock)
    return "trellis_product: rows per block must be 1, 4 or 8";
  switch (a.bits) {
    case 1: return launch_product_k<1>(a, rows_per_block, as_stream(stream));
    case 2: return launch_product_k<2>(a, rows_per_block, as_stream(stream));
    case 3: return launch_product_k<3>(a, rows_per_block, as_stream(stream));
    case 4: return launch_product_k<4>(a, rows_per_block, as_stream(stream));
    case 5: return launch_product_k<5>(a, rows_per_block, as_stream(stream));
    case 6: return launch_product_k<6>(a, rows_per_block, as_stream(stream));
    case 7: return launch_product_k<7>(a, rows_per_block, as_stream(stream));
    case 8: return launch_product_k<8>(a, rows_per_block, as_stream(stream));
  }
  return "EXL3 K outside 1..8";
}

const char* dense_gemv(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* w, int64_t out, const float* bias,
                       void* y, bool y_bf16, int64_t y_stride, int64_t col_offset, bool accumulate, void* stream) {
  if (rows <= 0) return nullptr;
  constexpr int kWarps = 8;
  dense_gemv_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>((out + kWarps - 1) / kWarps)), 32 * kWarps,
                      0, as_stream(stream)>>>(reinterpret_cast<const __nv_bfloat16*>(x), in,
                                              reinterpret_cast<const __nv_bfloat16*>(w), out, bias, y, y_bf16, y_stride,
                                              col_offset, accumulate);
  return launched();
}

const char* dequantize(const uint32_t* trellis, int bits, int codebook, int64_t k_pad, int64_t n_pad, int64_t in,
                       int64_t out, const float* suh, const float* svh, float hadamard_scale, void* dst, bool dst_bf16,
                       int64_t row_offset, void* stream) {
  const size_t smem = sizeof(float) * kHadamardSize * kLd;
  const cudaError_t e = cudaFuncSetAttribute(dequantize_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return cudaGetErrorString(e);
  dequantize_kernel<<<dim3(static_cast<unsigned>(k_pad / kHadamardSize), static_cast<unsigned>(n_pad / kHadamardSize)),
                      256, smem, as_stream(stream)>>>(trellis, bits, codebook, n_pad, in, out, suh, svh, hadamard_scale,
                                                      dst, dst_bf16, row_offset);
  return launched();
}

const char* copy_dense_rows(const uint16_t* w, int64_t count, void* dst, bool dst_bf16, int64_t offset, void* stream) {
  if (count <= 0) return nullptr;
  copy_dense_rows_kernel<<<grid_for(count, 256), 256, 0, as_stream(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(w), count, dst, dst_bf16, offset);
  return launched();
}

const char* decode_matrix(const uint32_t* trellis, int bits, int codebook, int64_t k_pad, int64_t n_pad, float* w,
                          void* stream) {
  decode_matrix_kernel<<<dim3(static_cast<unsigned>(k_pad / 16), static_cast<unsigned>((n_pad / 16 + 7) / 8)), 256, 0,
                         as_stream(stream)>>>(trellis, bits, codebook, n_pad, w);
  return launched();
}

const char* fill_random_words(uint32_t* words, int64_t count, uint64_t seed, void* stream) {
  if (count <= 0) return nullptr;
  fill_random_words_kernel<<<grid_for(count, 256), 256, 0, as_stream(stream)>>>(words, count, seed);
  return launched();
}

const char* fill_random_signs(float* v, int64_t count, float scale, uint64_t seed, void* stream) {
  if (count <= 0) return nullptr;
  fill_random_signs_kernel<<<grid_for(count, 256), 256, 0, as_stream(stream)>>>(v, count, scale, seed);
  return launched();
}

}  // namespace kiln::exl3::cuda

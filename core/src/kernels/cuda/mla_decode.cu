#include <climits>
#include <cmath>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/mla_decode.h"

namespace kiln::cuda {
namespace {

// Tiles per split under split_by_length: a function of the row's own tile count only.
__host__ __device__ inline int64_t tiles_per_length_split(int64_t tiles) {
  const int64_t spread = (tiles + kMlaLengthSplits - 1) / kMlaLengthSplits;
  return spread > 2 ? spread : 2;
}

constexpr int kRow = 576;             // latent + rope values per cached token
constexpr int kRowStride = kRow + 8;  // smem row pitch in bf16: 1168 bytes, so fragment reads avoid bank conflicts
constexpr int kTile = 64;             // tokens per pipeline stage
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunksPerRow = kRow * 2 / 16;  // 16-byte copies per cached row
constexpr int kScoreStride = kTile + 4;
constexpr int kPStride = kTile + 8;
constexpr float kLog2e = 1.4426950408889634f;

template <int kMTiles>
struct Smem {
  static constexpr int kHeads = 16 * kMTiles;
  static constexpr size_t kQ = 0;
  static constexpr size_t kKv = kQ + sizeof(uint16_t) * kHeads * kRowStride;
  static constexpr size_t kScores = kKv + sizeof(uint16_t) * 2 * kTile * kRowStride;
  static constexpr size_t kP = kScores + sizeof(float) * kHeads * kScoreStride;
  static constexpr size_t kStats = kP + sizeof(uint16_t) * kHeads * kPStride;  // m, l, alpha
  static constexpr size_t kBytes = kStats + sizeof(float) * 3 * kHeads;
};

// grid: (CTAs per row group, splits, row groups). A group's rows · heads (row, head) pairs, row-major, are spread
// evenly over the fewest CTAs of kMTiles·16 pairs (the rest of blockIdx.x exits); each CTA streams one split of
// the keys its rows can see (up to the largest kv_len among them) once and masks every pair by its row's kv_len.
// One row per group is the plain decode case: CTA x takes heads 16·kMTiles·x onward.
template <int kMTiles>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(MlaDecodeParams p, float* part_out,
                                                                 float* part_lse) {
  using L = Smem<kMTiles>;
  constexpr int kHeads = L::kHeads;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* s_q = reinterpret_cast<uint16_t*>(smem + L::kQ);
  uint16_t* s_kv = reinterpret_cast<uint16_t*>(smem + L::kKv);
  float* s_scores = reinterpret_cast<float*>(smem + L::kScores);
  uint16_t* s_p = reinterpret_cast<uint16_t*>(smem + L::kP);
  float* s_m = reinterpret_cast<float*>(smem + L::kStats);
  float* s_l = s_m + kHeads;
  float* s_alpha = s_l + kHeads;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma group id
  const int c = lane % 4;  // thread in group
  const int split = blockIdx.y;
  const int64_t first_row = p.row_groups ? p.row_groups[blockIdx.z] : blockIdx.z;
  const int heads = static_cast<int>(p.num_heads);
  const int pairs = (p.row_groups ? p.row_groups[blockIdx.z + 1] - static_cast<int>(first_row) : 1) * heads;
  const int ctas = (pairs + kHeads - 1) / kHeads;
  if (static_cast<int>(blockIdx.x) >= ctas) return;  // whole CTA: before any barrier
  const int chunk = (pairs + ctas - 1) / ctas;
  const int m0 = blockIdx.x * chunk;               // this CTA's (row, head) pairs: m0 .. m_end − 1 of the group
  const int m_end = min(m0 + chunk, pairs);
  const int64_t pair_base = first_row * heads;     // flat (row, head) index of the group's pair 0
  int kv_len = 0;                                  // the longest row among this CTA's
  for (int r = m0 / heads; r <= (m_end - 1) / heads; ++r) kv_len = max(kv_len, p.kv_len[first_row + r]);
  const int32_t* block_table = p.block_tables + static_cast<int64_t>(p.query_seq[first_row]) * p.max_blocks;
  const int32_t* selected = p.selected ? p.selected + first_row * p.selected_width : nullptr;
  const int64_t n_keys = selected ? p.selected_width : kv_len;
  // Keys visible to this thread's accumulator rows g and g + 8 of each m-tile: its row's kv_len (dense; with
  // selected positions the slot lookup already masks), 0 for padding pairs.
  int row_keys[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + mt * 16 + g + 8 * half;
      row_keys[mt][half] = m >= m_end ? 0 : selected ? INT_MAX : p.kv_len[first_row + m / heads];
    }
  const int64_t tiles_total = (n_keys + kTile - 1) / kTile;
  const int64_t tiles_per_split =
      p.split_by_length ? tiles_per_length_split(tiles_total) : (tiles_total + p.num_splits - 1) / p.num_splits;
  const int64_t tile_begin = split * tiles_per_split;
  const int64_t tile_end = min(tiles_total, tile_begin + tiles_per_split);

  // Warp w copies, and scores, rows 8w..8w+7 of each tile. Lane j < 8 looks up the slot of the warp's row j
  // (one lookup per row, −1 when not visible); the copy of a row is 72 16-byte pieces over the warp's lanes.
  constexpr int kRowsPerWarp = kTile / kWarps;
  static_assert(kRowsPerWarp == 8, "the score phase gives each warp one n8 tile of keys");
  auto slot_of = [&](int64_t tile) -> int64_t {
    const int64_t j = tile * kTile + warp * kRowsPerWarp + lane;
    if (lane >= kRowsPerWarp || j >= n_keys) return -1;
    const int64_t pos = selected ? selected[j] : j;
    if (pos < 0 || pos >= kv_len) return -1;
    return static_cast<int64_t>(block_table[pos / p.block_size]) * p.block_size + pos % p.block_size;
  };
  auto issue_rows = [&](int64_t slot_lane, int buf) {
    uint16_t* dst = s_kv + (buf * kTile + warp * kRowsPerWarp) * kRowStride;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t slot = __shfl_sync(~0u, slot_lane, r);
      const uint16_t* src = slot >= 0 ? p.cache + slot * kRow : p.cache;
#pragma unroll
      for (int k = 0; k < (kChunksPerRow + 31) / 32; ++k) {
        const int ch = lane + 32 * k;
        if (ch < kChunksPerRow) cp_async_16(dst + r * kRowStride + ch * 8, src + ch * 8, slot >= 0);
      }
    }
    cp_async_commit();
  };

  int64_t slot_cur = -1;
  if (tile_begin < tile_end) {
    slot_cur = slot_of(tile_begin);
    issue_rows(slot_cur, 0);
  }

  // q → bf16 in shared memory while the first tile streams in; padding pairs are zero (never written out).
  for (int i = tid; i < kHeads * kRow / 4; i += kThreads) {
    const int h = i / (kRow / 4), d = (i % (kRow / 4)) * 4;
    const float4 v = m0 + h < m_end ? *reinterpret_cast<const float4*>(p.q + (pair_base + m0 + h) * kRow + d)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
    uint2 packed;
    packed.x = float_to_bf16_bits(v.x) | static_cast<uint32_t>(float_to_bf16_bits(v.y)) << 16;
    packed.y = float_to_bf16_bits(v.z) | static_cast<uint32_t>(float_to_bf16_bits(v.w)) << 16;
    *reinterpret_cast<uint2*>(s_q + h * kRowStride + d) = packed;
  }
  if (tid < kHeads) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.f;
  }

  float acc_o[kMTiles][8][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc_o[mt][nt][k] = 0.f;

  const float score_scale = p.scale * kLog2e;  // softmax in base 2
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int buf = static_cast<int>((tile - tile_begin) & 1);
    const bool has_next = tile + 1 < tile_end;
    const int64_t slot_next = has_next ? slot_of(tile + 1) : -1;
    __syncthreads();  // every warp is done with the buffer the next tile goes to (and q / stats are written)
    if (has_next) {
      issue_rows(slot_next, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* kv = s_kv + buf * kTile * kRowStride;

    // Scores: warp w takes tokens 8w..8w+7 for every head of the group, K = 576, two k16 steps per round:
    // one ldmatrix.x4 gives the K fragments of both steps, one per m-tile and step gives Q's.
    {
      float acc_s[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc_s[mt][k] = 0.f;
      const uint16_t* k_src = kv + (warp * 8 + lane % 8) * kRowStride + (lane / 8) * 8;
      const uint16_t* q_src = s_q + (lane % 16) * kRowStride + (lane / 16) * 8;
#pragma unroll 3
      for (int ks = 0; ks < kRow / 16; ks += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, k_src + ks * 16);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          uint32_t a0[4], a1[4];
          ldmatrix_x4(a0, q_src + mt * 16 * kRowStride + ks * 16);
          ldmatrix_x4(a1, q_src + mt * 16 * kRowStride + ks * 16 + 16);
          mma_bf16_16816(acc_s[mt], a0, b[0], b[1]);
          mma_bf16_16816(acc_s[mt], a1, b[2], b[3]);
        }
      }
      const int t0 = warp * 8 + 2 * c;
      const int j0 = static_cast<int>(tile * kTile) + t0;  // key index of column t0 (its position when dense)
      const bool v0 = __shfl_sync(~0u, slot_cur, 2 * c) >= 0, v1 = __shfl_sync(~0u, slot_cur, 2 * c + 1) >= 0;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        float* row0 = s_scores + (mt * 16 + g) * kScoreStride + t0;
        float* row1 = row0 + 8 * kScoreStride;
        const int k0 = row_keys[mt][0], k1 = row_keys[mt][1];
        row0[0] = v0 && j0 < k0 ? acc_s[mt][0] * score_scale : -INFINITY;
        row0[1] = v1 && j0 + 1 < k0 ? acc_s[mt][1] * score_scale : -INFINITY;
        row1[0] = v0 && j0 < k1 ? acc_s[mt][2] * score_scale : -INFINITY;
        row1[1] = v1 && j0 + 1 < k1 ? acc_s[mt][3] * score_scale : -INFINITY;
      }
    }
    slot_cur = slot_next;
    __syncthreads();

    // Online softmax: kPerRow consecutive threads share one pair row (48 rows: 4 each, the last two warps idle).
    constexpr int kPerRow = kHeads == 16 ? 16 : kHeads == 32 ? 8 : 4;
    static_assert(kHeads * kPerRow <= kThreads && (kHeads * kPerRow) % 32 == 0, "whole warps per softmax row set");
    if (tid < kHeads * kPerRow) {
      constexpr int kCols = kTile / kPerRow;
      const int row = tid / kPerRow;
      const int part = tid % kPerRow;
      const float* s = s_scores + row * kScoreStride + part * kCols;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCols; ++j) tile_max = fmaxf(tile_max, s[j]);
#pragma unroll
      for (int off = kPerRow / 2; off > 0; off /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(~0u, tile_max, off));
      const float m_old = s_m[row];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.f;
      uint16_t* prow = s_p + row * kPStride + part * kCols;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const float e = m_new == -INFINITY ? 0.f : exp2f(s[j] - m_new);
        sum += e;
        prow[j] = float_to_bf16_bits(e);
      }
#pragma unroll
      for (int off = kPerRow / 2; off > 0; off /= 2) sum += __shfl_xor_sync(~0u, sum, off);
      __syncwarp();
      if (part == 0) {
        const float alpha = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
        s_alpha[row] = alpha;
        s_l[row] = s_l[row] * alpha + sum;
        s_m[row] = m_new;
      }
    }
    __syncthreads();

    // Values: warp w owns latent columns 64w..64w+63; P from shared memory, V = first 512 values of each row.
    {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const float a0 = s_alpha[mt * 16 + g], a1 = s_alpha[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          acc_o[mt][nt][0] *= a0;
          acc_o[mt][nt][1] *= a0;
          acc_o[mt][nt][2] *= a1;
          acc_o[mt][nt][3] *= a1;
        }
      }
      const uint16_t* p_src = s_p + (lane % 16) * kPStride + (lane / 16) * 8;
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a[mt], p_src + mt * 16 * kPStride + ks * 16);
        const int v_row = ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, kv + v_row * kRowStride + warp * 64 + np * 16 + (lane / 16) * 8);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16_16816(acc_o[mt][2 * np], a[mt], b[0], b[1]);
            mma_bf16_16816(acc_o[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  __syncthreads();  // s_l final (also covers a split with no tiles)

  // Normalised output (or this split's normalised partial plus its log-sum-exp, natural log).
  const bool direct = p.num_splits == 1;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = mt * 16 + g + 8 * half;
      if (m0 + row >= m_end) continue;
      const float l = s_l[row];
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      const int64_t qh = pair_base + m0 + row;
      float* dst = direct ? p.out + qh * kMlaLatentDim
                          : part_out + (static_cast<int64_t>(split) * p.num_queries * p.num_heads + qh) * kMlaLatentDim;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = warp * 64 + nt * 8 + 2 * c;
        *reinterpret_cast<float2*>(dst + col) =
            make_float2(acc_o[mt][nt][2 * half] * inv_l, acc_o[mt][nt][2 * half + 1] * inv_l);
      }
      if (!direct && c == 0 && warp == 0)
        part_lse[static_cast<int64_t>(split) * p.num_queries * p.num_heads + qh] =
            l > 0.f ? s_m[row] / kLog2e + logf(l) : -INFINITY;
    }
  }
}

// One block per (query, head): split weights exp(lse_s − max) once into shared memory, then kCombineGroups
// thread groups each sum a quarter of the splits over all 512 columns (float4 per thread), merged in shared memory.
constexpr int kCombineGroups = 4;
constexpr int kMaxSplits = 1024;

__global__ void __launch_bounds__(kCombineGroups * 128) mla_combine_kernel(const float* __restrict__ part_out,
                                                                           const float* __restrict__ part_lse,
                                                                           int64_t rows, int num_splits,
                                                                           float* __restrict__ out) {
  __shared__ float s_weight[kMaxSplits];
  __shared__ float4 s_acc[kCombineGroups][128];
  __shared__ float s_inv_total;
  const int64_t qh = blockIdx.x;
  const int tid = threadIdx.x;
  if (tid < 32) {
    float lse_max = -INFINITY;
    for (int s = tid; s < num_splits; s += 32) lse_max = fmaxf(lse_max, part_lse[s * rows + qh]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(~0u, lse_max, off));
    float total = 0.f;
    for (int s = tid; s < num_splits; s += 32) {
      const float lse = part_lse[s * rows + qh];
      const float w = lse == -INFINITY ? 0.f : expf(lse - lse_max);
      s_weight[s] = w;
      total += w;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(~0u, total, off);
    if (tid == 0) s_inv_total = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  const int group = tid / 128, col4 = tid % 128;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int s = group; s < num_splits; s += kCombineGroups) {
    const float w = s_weight[s];
    if (w == 0.f) continue;  // an empty split's partial is never read
    const float4 v = reinterpret_cast<const float4*>(part_out + (s * rows + qh) * kMlaLatentDim)[col4];
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  s_acc[group][col4] = acc;
  __syncthreads();
  if (group == 0) {
    float4 sum = s_acc[0][col4];
#pragma unroll
    for (int g = 1; g < kCombineGroups; ++g) {
      const float4 v = s_acc[g][col4];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const float inv = s_inv_total;
    reinterpret_cast<float4*>(out + qh * kMlaLatentDim)[col4] =
        make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv);
  }
}

// M tiles per CTA for groups of up to `rows` rows: one row keeps the plain decode shape (16 heads, or 32 per CTA);
// several rows take 48 pairs (3 tiles: Q, two 64-token stages, scores and P fill 221 KB of shared memory).
int mtiles_for(int64_t rows, int64_t heads) {
  const int64_t pairs = rows * heads;
  if (pairs <= 16) return 1;
  if (pairs <= 32 || rows == 1) return 2;
  return 3;
}

int64_t ctas_per_group(int64_t rows, int64_t heads) {
  const int64_t per_cta = 16 * mtiles_for(rows, heads);
  return (rows * heads + per_cta - 1) / per_cta;
}

template <int kMTiles>
Status launch(const MlaDecodeParams& p, StreamHandle stream, float* part_out, float* part_lse) {
  constexpr size_t kBytes = Smem<kMTiles>::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      mla_decode_kernel<kMTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  KILN_RETURN_IF_ERROR(check_cuda(attr, "cuda::mla_decode_bf16: shared memory limit"));
  const int64_t rows = p.row_groups ? p.max_group_rows : 1;
  const dim3 grid(static_cast<unsigned>(ctas_per_group(rows, p.num_heads)), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.row_groups ? p.num_groups : p.num_queries));
  mla_decode_kernel<kMTiles><<<grid, kThreads, kBytes, stream>>>(p, part_out, part_lse);
  return check_launch("cuda::mla_decode_bf16");
}

}  // namespace

std::vector<int32_t> mla_decode_row_groups(const int32_t* query_seq, int64_t num_queries) {
  std::vector<int32_t> first{0};
  for (int64_t i = 1; i < num_queries; ++i)
    if (query_seq[i] != query_seq[i - 1] || i - first.back() >= kMlaMaxGroupRows) first.push_back(static_cast<int32_t>(i));
  if (num_queries > 0) first.push_back(static_cast<int32_t>(num_queries));
  return first;
}

int mla_decode_num_splits(int64_t num_queries, int64_t num_heads, int64_t max_keys, int sm_count) {
  return mla_decode_grouped_num_splits(num_queries, 1, num_heads, max_keys, sm_count);
}

int mla_decode_grouped_num_splits(int64_t num_groups, int64_t max_group_rows, int64_t num_heads, int64_t max_keys,
                                  int sm_count) {
  const int64_t ctas = std::max<int64_t>(1, num_groups * ctas_per_group(std::max<int64_t>(1, max_group_rows), num_heads));
  const int64_t by_occupancy = (sm_count + ctas - 1) / ctas;
  const int64_t by_length = std::max<int64_t>(1, (max_keys + 2 * kTile - 1) / (2 * kTile));
  return static_cast<int>(std::max<int64_t>(1, std::min(by_occupancy, by_length)));
}

int mla_decode_length_splits(int64_t max_keys) {
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kTile - 1) / kTile);
  return static_cast<int>((tiles + tiles_per_length_split(tiles) - 1) / tiles_per_length_split(tiles));
}

size_t mla_decode_workspace_bytes(int64_t num_queries, int64_t num_heads, int num_splits) {
  if (num_splits <= 1) return 0;
  return sizeof(float) * static_cast<size_t>(num_splits) * num_queries * num_heads * (kMlaLatentDim + 1);
}

Status mla_decode_bf16(const MlaDecodeParams& p, StreamHandle stream) {
  if (p.num_queries < 0 || p.num_heads <= 0 || p.block_size <= 0 || p.num_splits < 1)
    return invalid_argument("cuda::mla_decode_bf16: need num_heads > 0, block_size > 0 and num_splits ≥ 1");
  if (p.selected && p.selected_width <= 0)
    return invalid_argument("cuda::mla_decode_bf16: selected needs selected_width > 0");
  if (p.num_splits > kMaxSplits) return invalid_argument("cuda::mla_decode_bf16: num_splits must be ≤ 1024");
  if (p.num_splits > 1 && !p.workspace)
    return invalid_argument("cuda::mla_decode_bf16: num_splits > 1 needs mla_decode_workspace_bytes of workspace");
  if (reinterpret_cast<uintptr_t>(p.q) % 16 != 0)
    return invalid_argument("cuda::mla_decode_bf16: q must be 16-byte aligned (it is read as float4)");
  if (p.row_groups && (p.selected || p.num_groups < 1 || p.max_group_rows < 1))
    return invalid_argument("cuda::mla_decode_bf16: row_groups needs dense attention, num_groups ≥ 1 and max_group_rows ≥ 1");
  if (p.num_queries == 0) return ok_status();
  const int64_t rows = p.num_queries * p.num_heads;
  float* part_out = static_cast<float*>(p.workspace);
  float* part_lse = p.num_splits > 1 ? part_out + static_cast<int64_t>(p.num_splits) * rows * kMlaLatentDim : nullptr;
  const int mtiles = mtiles_for(p.row_groups ? p.max_group_rows : 1, p.num_heads);
  const Status launched = mtiles == 1   ? launch<1>(p, stream, part_out, part_lse)
                          : mtiles == 2 ? launch<2>(p, stream, part_out, part_lse)
                                        : launch<3>(p, stream, part_out, part_lse);
  KILN_RETURN_IF_ERROR(launched);
  if (p.num_splits > 1) {
    mla_combine_kernel<<<static_cast<unsigned>(rows), kCombineGroups * 128, 0, stream>>>(part_out, part_lse, rows, p.num_splits, p.out);
    KILN_RETURN_IF_ERROR(check_launch("cuda::mla_decode_bf16 (combine)"));
  }
  return ok_status();
}

}  // namespace kiln::cuda

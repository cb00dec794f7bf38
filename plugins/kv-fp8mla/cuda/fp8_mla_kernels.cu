// The CUDA kernels of `fp8_ds_mla`, the plain form: correct, bit-exact with the host codec where the format is
// concerned (quantization), and simple (attention on CUDA cores, one block per query row and head, no split-KV).
// A tensor-core decode kernel reading the fp8 pages is the next step for speed (bench/RESULTS.md).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "fp8_mla_row_store.cuh"
#include "fp8_mla_kernels.h"
#include "kiln/cuda/pdl_launch.cuh"
#include "kiln/cuda/warp_mma.cuh"

namespace kiln::fp8mla {
namespace {

constexpr int kWarp = 32;
constexpr int kAppendThreads = kTileThreads;  // one thread per value of a 128-value tile
constexpr int kAttendThreads = 256;
constexpr int kAttendWarps = kAttendThreads / kWarp;
constexpr int kAttendTile = 32;
constexpr int kGatherWarps = 4;
constexpr size_t kSharedLimit = 48 * 1024;
constexpr size_t kAttendStaticShared =
    kAttendTile * (sizeof(float) + sizeof(const uint8_t*)) + kAttendWarps * sizeof(float);

__device__ __forceinline__ float bf16_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }


__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float tile_scale(const uint8_t* row, const RowShape& s, int64_t tile) {
  float scale;
  memcpy(&scale, row + s.scales_offset + 4 * tile, 4);
  return scale;
}

// Block t quantizes row t, one 128-value tile at a time: thread i takes value i of the tile.
__global__ void __launch_bounds__(kAppendThreads) append_kernel(RowShape s, const float* rows, int64_t row_stride,
                                                                const int64_t* slots, uint8_t* pages) {
  __shared__ float warp_amax[kTileThreads / 32];
  // Launched with programmatic dependent launch: the rows come from the kernel just before (the core's norm / rope
  // pass); the kernels after start their prologues while this one runs.
  kiln::cuda::pdl_wait();
  kiln::cuda::pdl_launch_dependents();
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  const float* src = rows + t * row_stride;
  uint8_t* dst = pages + slot * s.row_bytes;
  for (int64_t tile = 0; tile < s.tiles; ++tile) {
    const int64_t i = tile * 128 + threadIdx.x;
    quantize_tile(i < s.latent ? src[i] : 0.0f, i < s.latent, warp_amax, dst + i, dst + s.scales_offset + 4 * tile);
  }
  for (int64_t i = threadIdx.x; i < s.rope; i += blockDim.x) {
    const uint16_t b = float_to_bf16(src[s.latent + i]);
    memcpy(dst + s.rope_offset + 2 * i, &b, 2);
  }
  for (int64_t i = s.rope_offset + 2 * s.rope + threadIdx.x; i < s.row_bytes; i += blockDim.x) dst[i] = 0;  // padding
}

// Element i of a row as fp32 (latent: e4m3 · its tile's scale; rope: bf16).
__device__ __forceinline__ float value_at(const uint8_t* row, const RowShape& s, int64_t i) {
  if (i < s.latent) return e4m3_to_float(row[i]) * tile_scale(row, s, i / 128);
  uint16_t b;
  memcpy(&b, row + s.rope_offset + 2 * (i - s.latent), 2);
  return bf16_to_float(b);
}

__global__ void __launch_bounds__(kAttendThreads) attend_kernel(AttendParams p) {
  extern __shared__ float shared[];
  __shared__ float tile_weight[kAttendTile];
  __shared__ const uint8_t* tile_row[kAttendTile];
  __shared__ float warp_max[kAttendWarps];
  const RowShape& s = p.shape;
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const int64_t L = s.latent, width = s.latent + s.rope;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* q = shared;
  float* acc = q + width;
  int32_t* listed = reinterpret_cast<int32_t*>(acc + L);
  int32_t* visible = listed + p.selected_width;

  const float* q_row = p.q + (r * p.num_heads + h) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) q[i] = q_row[i];
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) acc[i] = 0.0f;
  const int64_t kv_len = p.kv_len[r];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[r]) * p.max_blocks;
  int64_t candidates = kv_len;
  if (p.selected) {
    candidates = p.selected_width;
    for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) listed[j] = p.selected[r * candidates + j];
    __syncthreads();
    for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) {  // a position listed twice is one key
      const int32_t t = listed[j];
      bool keep = t >= 0 && t < kv_len;
      for (int64_t k = 0; keep && k < j; ++k) keep = listed[k] != t;
      visible[j] = keep ? t : -1;
    }
  }
  __syncthreads();

  auto row_of = [&](int64_t j) -> const uint8_t* {
    const int64_t t = p.selected ? visible[j] : j;
    if (t < 0) return nullptr;
    const int64_t slot = static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size;
    return p.pages + slot * s.row_bytes;
  };
  auto score = [&](const uint8_t* row) {
    float acc_s = 0.0f;
    for (int64_t i = lane; i < width; i += kWarp) acc_s += q[i] * value_at(row, s, i);
    for (int o = kWarp / 2; o > 0; o /= 2) acc_s += __shfl_xor_sync(0xffffffffu, acc_s, o);
    return acc_s * p.scale;
  };

  float max_score = -INFINITY;
  for (int64_t j = warp; j < candidates; j += kAttendWarps) {
    const uint8_t* row = row_of(j);
    if (row) max_score = fmaxf(max_score, score(row));
  }
  if (lane == 0) warp_max[warp] = max_score;
  __syncthreads();
  max_score = warp_max[0];
  for (int w = 1; w < kAttendWarps; ++w) max_score = fmaxf(max_score, warp_max[w]);

  float sum = 0.0f;
  for (int64_t base = 0; base < candidates; base += kAttendTile) {
    for (int k = warp; k < kAttendTile; k += kAttendWarps) {
      const uint8_t* row = base + k < candidates ? row_of(base + k) : nullptr;
      const float weight = row ? expf(score(row) - max_score) : 0.0f;
      if (lane == 0) tile_weight[k] = weight, tile_row[k] = row;
    }
    __syncthreads();
    for (int k = 0; k < kAttendTile; ++k) {
      const uint8_t* row = tile_row[k];
      if (!row) continue;
      const float weight = tile_weight[k];
      sum += weight;
      for (int64_t i = threadIdx.x; i < L; i += blockDim.x) acc[i] += weight * value_at(row, s, i);
    }
    __syncthreads();
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const int64_t o = (r * p.num_heads + h) * L;
  if (p.out_lse && threadIdx.x == 0) p.out_lse[r * p.num_heads + h] = sum > 0.0f ? max_score + logf(sum) : -INFINITY;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
    const float v = acc[i] * inv;
    if (p.out) p.out[o + i] = v;
    if (p.out_bf16) p.out_bf16[o + i] = float_to_bf16(v);
  }
}

__global__ void gather_kernel(RowShape s, const uint8_t* pages, int64_t block_size, const int32_t* block_tables,
                              int64_t max_blocks, const GatherSeq* seqs, uint16_t* out) {
  const GatherSeq q = seqs[blockIdx.y];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kGatherWarps + threadIdx.x / kWarp;
  if (t >= q.kv_len) return;
  const int32_t page = block_tables[static_cast<int64_t>(q.table_row) * max_blocks + t / block_size];
  const uint8_t* row = pages + (static_cast<int64_t>(page) * block_size + t % block_size) * s.row_bytes;
  const int64_t width = s.latent + s.rope;
  uint16_t* dst = out + (q.key_start + t) * width;
  for (int64_t i = threadIdx.x % kWarp; i < width; i += kWarp) dst[i] = float_to_bf16(value_at(row, s, i));
}

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_append(const RowShape& s, const float* rows, int64_t row_stride, const int64_t* slots, int64_t n,
                          uint8_t* pages, void* stream) {
  if (n == 0) return nullptr;
  static const bool pdl = kiln::cuda::pdl_supported_on_current_device();
  const cudaError_t e = kiln::cuda::launch_with_pdl(append_kernel, dim3(static_cast<unsigned>(n)), dim3(kAppendThreads),
                                                    0, static_cast<cudaStream_t>(stream), pdl, s, rows, row_stride,
                                                    slots, pages);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* launch_attend(const AttendParams& p, void* stream) {
  if (p.num_queries == 0 || p.num_heads == 0) return nullptr;
  const int64_t listed = p.selected ? 2 * p.selected_width : 0;
  const size_t shared = static_cast<size_t>(2 * p.shape.latent + p.shape.rope) * sizeof(float) +
                        static_cast<size_t>(listed) * sizeof(int32_t);
  if (shared + kAttendStaticShared > kSharedLimit)
    return "latent, rope and selection too wide for the plain kernel's shared memory (48 KiB)";
  const dim3 grid(static_cast<unsigned>(p.num_queries), static_cast<unsigned>(p.num_heads));
  attend_kernel<<<grid, kAttendThreads, shared, static_cast<cudaStream_t>(stream)>>>(p);
  return launched();
}

const char* launch_gather(const RowShape& s, const uint8_t* pages, int64_t block_size, const int32_t* block_tables,
                          int64_t max_blocks, const GatherSeq* seqs, int64_t num_seqs, int64_t max_kv_len,
                          uint16_t* out, void* stream) {
  if (num_seqs == 0 || max_kv_len == 0) return nullptr;
  const dim3 grid(static_cast<unsigned>((max_kv_len + kGatherWarps - 1) / kGatherWarps),
                  static_cast<unsigned>(num_seqs));
  gather_kernel<<<grid, kGatherWarps * kWarp, 0, static_cast<cudaStream_t>(stream)>>>(s, pages, block_size,
                                                                                     block_tables, max_blocks, seqs, out);
  return launched();
}

}  // namespace kiln::fp8mla

// ---------------------------------------------------------------------------------------------------------------
// Split-KV attention (see the header). Block (r, split, head group): 256 threads, up to 16 heads; candidates of the
// split in tiles of 16 keys: their rows are resolved (selection: listed once, visible), dequantized into shared
// memory as fp32 (e4m3 · scale, rope widened: the host's values exactly), scored by warps (lanes over the row's
// values, a shuffle tree), folded into per-head running max / sum, and accumulated by every thread into its own
// (head, dim) sums. Partials are unnormalised sums with their max and sum; the merge takes a row's splits in order.

namespace kiln::fp8mla {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kSplitWarps = kSplitThreads / kWarp;
constexpr int kHeadsPerBlock = 16;
constexpr int kTileKeys = 16;
constexpr int kMaxDimsPerThread = 4;  // latent ≤ 1024
constexpr size_t kSplitSharedLimit = 200 * 1024;

// A row's candidates per split: at least 64, and at most `slots` splits.
__host__ __device__ inline int64_t keys_per_split(int64_t n, int64_t slots) {
  const int64_t even = (n + slots - 1) / slots;
  const int64_t rounded = (even + kTileKeys - 1) / kTileKeys * kTileKeys;
  return rounded > 64 ? rounded : 64;
}

size_t split_shared_bytes(const RowShape& s, int64_t selected_width) {
  const int64_t width = s.latent + s.rope;
  return static_cast<size_t>(kHeadsPerBlock * width + kTileKeys * width + kHeadsPerBlock * kTileKeys +
                             3 * kHeadsPerBlock) * sizeof(float) +
         kTileKeys * sizeof(const uint8_t*) + static_cast<size_t>(selected_width) * sizeof(int32_t);
}

__global__ void __launch_bounds__(kSplitThreads) split_attend_kernel(AttendParams p, float* part_acc, float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const RowShape& s = p.shape;
  const int64_t L = s.latent, width = s.latent + s.rope;
  float* qs = reinterpret_cast<float*>(smem_raw);               // [16][width]
  float* tile = qs + kHeadsPerBlock * width;                      // [kTileKeys][width]: dequantized
  float* pw = tile + kTileKeys * width;                           // [16][kTileKeys]
  float* m_s = pw + kHeadsPerBlock * kTileKeys;                   // [16]
  float* l_s = m_s + kHeadsPerBlock;
  float* alpha_s = l_s + kHeadsPerBlock;
  const uint8_t** rows = reinterpret_cast<const uint8_t**>(alpha_s + kHeadsPerBlock);  // [kTileKeys]
  int32_t* sel_s = reinterpret_cast<int32_t*>(rows + kTileKeys);                        // [selected_width]

  const int64_t r = blockIdx.x, split = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.z) * kHeadsPerBlock;
  const int nh = static_cast<int>(p.num_heads - h0 < kHeadsPerBlock ? p.num_heads - h0 : kHeadsPerBlock);
  const int64_t kv_len = p.kv_len[r];
  const int64_t n = p.selected ? p.selected_width : kv_len;
  const int64_t kps = keys_per_split(n, p.split_slots);
  const int64_t j0 = split * kps, j1 = n < j0 + kps ? n : j0 + kps;
  if (j0 >= j1) return;  // past this row's splits (the merge knows the count)
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.query_seq[r]) * p.max_blocks;
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;

  for (int64_t i = tid; i < kHeadsPerBlock * width; i += kSplitThreads) {
    const int64_t hh = i / width;
    qs[i] = hh < nh ? p.q[(r * p.num_heads + h0 + hh) * width + i % width] : 0.0f;
  }
  if (p.selected)
    for (int64_t j = tid; j < j1; j += kSplitThreads) sel_s[j] = p.selected[r * p.selected_width + j];
  if (tid < kHeadsPerBlock) m_s[tid] = -INFINITY, l_s[tid] = 0.0f;
  float acc[kHeadsPerBlock][kMaxDimsPerThread];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerBlock; ++hh)
#pragma unroll
    for (int u = 0; u < kMaxDimsPerThread; ++u) acc[hh][u] = 0.0f;
  __syncthreads();

  for (int64_t jt = j0; jt < j1; jt += kTileKeys) {
    // Resolve the tile's candidates to rows (null: not a key).
    if (tid < kTileKeys) {
      const int64_t j = jt + tid;
      int64_t t = -1;
      if (j < j1) {
        if (p.selected) {
          t = sel_s[j];
          bool keep = t >= 0 && t < kv_len;
          for (int64_t k = 0; keep && k < j; ++k) keep = sel_s[k] != t;  // listed twice: one key
          if (!keep) t = -1;
        } else {
          t = j;
        }
      }
      rows[tid] = t < 0 ? nullptr
                        : p.pages + (static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size) *
                                        s.row_bytes;
    }
    __syncthreads();
    // Dequantized straight from global memory: each thread's loads wait one round trip per value, which is what
    // bounds this kernel today (a cp.async double buffer of the raw rows is the next step).
    for (int64_t i = tid; i < kTileKeys * width; i += kSplitThreads) {
      const uint8_t* row = rows[i / width];
      tile[i] = row ? value_at(row, s, i % width) : 0.0f;
    }
    __syncthreads();
    // Scores: warp w takes (head, key) pairs w, w + 8, ...
    for (int pair = warp; pair < kHeadsPerBlock * kTileKeys; pair += kSplitWarps) {
      const int hh = pair / kTileKeys, k = pair % kTileKeys;
      float dot = 0.0f;
      const bool live = hh < nh && rows[k] != nullptr;
      if (live) {
        const float* qh = qs + hh * width;
        const float* kr = tile + k * width;
        for (int64_t i = lane; i < width; i += kWarp) dot = fmaf(qh[i], kr[i], dot);
      }
      for (int o = kWarp / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) pw[hh * kTileKeys + k] = live ? dot * p.scale : -INFINITY;
    }
    __syncthreads();
    // Online softmax, one thread per head.
    if (tid < kHeadsPerBlock) {
      float* w = pw + tid * kTileKeys;
      float tile_max = -INFINITY;
      for (int k = 0; k < kTileKeys; ++k) tile_max = fmaxf(tile_max, w[k]);
      const float m_old = m_s[tid], m_new = fmaxf(m_old, tile_max);
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);  // exp(−inf) = 0 for a first tile
      float sum = 0.0f;
      for (int k = 0; k < kTileKeys; ++k) {
        const float e = w[k] == -INFINITY ? 0.0f : expf(w[k] - m_new);
        w[k] = e;
        sum += e;
      }
      l_s[tid] = l_s[tid] * alpha + sum;
      m_s[tid] = m_new;
      alpha_s[tid] = alpha;
    }
    __syncthreads();
    // Every index into acc is a constant after unrolling (a dynamic one would put it in local memory).
#pragma unroll
    for (int u = 0; u < kMaxDimsPerThread; ++u) {
      const int64_t d = tid + static_cast<int64_t>(u) * kSplitThreads;
      if (d < L) {
        float v[kTileKeys];
#pragma unroll
        for (int k = 0; k < kTileKeys; ++k) v[k] = tile[k * width + d];
#pragma unroll
        for (int hh = 0; hh < kHeadsPerBlock; ++hh) {
          float a = acc[hh][u] * alpha_s[hh];
#pragma unroll
          for (int k = 0; k < kTileKeys; ++k) a = fmaf(pw[hh * kTileKeys + k], v[k], a);
          acc[hh][u] = a;
        }
      }
    }
    __syncthreads();  // tile, rows and weights are read before the next tile replaces them
  }
#pragma unroll
  for (int hh = 0; hh < kHeadsPerBlock; ++hh) {
    if (hh >= nh) break;
    const int64_t slot = ((r * p.num_heads + h0 + hh) * p.split_slots + split);
#pragma unroll
    for (int u = 0; u < kMaxDimsPerThread; ++u) {
      const int64_t d = tid + static_cast<int64_t>(u) * kSplitThreads;
      if (d < L) part_acc[slot * L + d] = acc[hh][u];
    }
    if (tid == 0) part_ml[2 * slot] = m_s[hh], part_ml[2 * slot + 1] = l_s[hh];
  }
}

// Block (r, h): the row's splits merged in order: out = Σ_s acc_s · e^{m_s − M} / Σ_s l_s · e^{m_s − M}.
__global__ void split_merge_kernel(AttendParams p, const float* part_acc, const float* part_ml) {
  const int64_t r = blockIdx.x, h = blockIdx.y, L = p.shape.latent;
  const int64_t n = p.selected ? p.selected_width : p.kv_len[r];
  const int64_t kps = keys_per_split(n, p.split_slots), splits = (n + kps - 1) / kps;
  const int64_t base = (r * p.num_heads + h) * p.split_slots;
  float M = -INFINITY;
  for (int64_t sp = 0; sp < splits; ++sp) M = fmaxf(M, part_ml[2 * (base + sp)]);
  float total = 0.0f;
  for (int64_t sp = 0; sp < splits; ++sp) {
    const float m = part_ml[2 * (base + sp)];
    if (m != -INFINITY) total += part_ml[2 * (base + sp) + 1] * expf(m - M);
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const int64_t o = (r * p.num_heads + h) * L;
  if (p.out_lse && threadIdx.x == 0) p.out_lse[r * p.num_heads + h] = total > 0.0f ? M + logf(total) : -INFINITY;
  for (int64_t d = threadIdx.x; d < L; d += blockDim.x) {
    float v = 0.0f;
    for (int64_t sp = 0; sp < splits; ++sp) {
      const float m = part_ml[2 * (base + sp)];
      if (m != -INFINITY) v += part_acc[(base + sp) * L + d] * expf(m - M);
    }
    v *= inv;
    if (p.out) p.out[o + d] = v;
    if (p.out_bf16) p.out_bf16[o + d] = float_to_bf16(v);
  }
}

}  // namespace

size_t split_attend_workspace(int64_t num_queries, int64_t num_heads, int64_t latent, int64_t slots) {
  return static_cast<size_t>(num_queries * num_heads * slots) * static_cast<size_t>(latent + 2) * sizeof(float);
}

bool split_attend_supported(const RowShape& s, int64_t selected_width) {
  return s.latent <= kMaxDimsPerThread * kSplitThreads && split_shared_bytes(s, selected_width) <= kSplitSharedLimit;
}

const char* launch_split_attend(const AttendParams& p, void* workspace, void* stream) {
  if (p.num_queries == 0 || p.num_heads == 0) return nullptr;
  if (!split_attend_supported(p.shape, p.selected ? p.selected_width : 0))
    return "shape beyond the split kernel's limits (latent ≤ 1024, ≤ 200 KiB of tiles and selection)";
  const size_t shared = split_shared_bytes(p.shape, p.selected ? p.selected_width : 0);
  static const cudaError_t opted =
      cudaFuncSetAttribute(split_attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSplitSharedLimit);
  if (opted != cudaSuccess) return cudaGetErrorString(opted);
  float* part_acc = static_cast<float*>(workspace);
  if (p.split_slots < 1 || p.split_slots > kSplitSlots) return "split slots outside 1..64";
  float* part_ml = part_acc + p.num_queries * p.num_heads * p.split_slots * p.shape.latent;
  const dim3 grid(static_cast<unsigned>(p.num_queries), static_cast<unsigned>(p.split_slots),
                  static_cast<unsigned>((p.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  split_attend_kernel<<<grid, kSplitThreads, shared, st>>>(p, part_acc, part_ml);
  if (const char* e = launched()) return e;
  split_merge_kernel<<<dim3(static_cast<unsigned>(p.num_queries), static_cast<unsigned>(p.num_heads)), 128, 0, st>>>(
      p, part_acc, part_ml);
  return launched();
}

}  // namespace kiln::fp8mla

// The CUDA kernels of `bf16-copy`: deliberately plain (correct and readable, not fast). Attention is exact
// two-pass softmax in fp32 on CUDA cores: pass 1 finds the largest score, pass 2 recomputes each score and
// accumulates exp(score − max) · row, so it needs no workspace and no split-KV plan.
#include <cuda_runtime.h>

#include <cmath>

#include "bf16_copy_kernels.h"

namespace example_plugin {
namespace {

constexpr int kWarp = 32;
constexpr int kAttendThreads = 256;
constexpr int kAttendWarps = kAttendThreads / kWarp;
constexpr int kAttendTile = 32;  // keys scored together (one per warp at a time) in pass 2
constexpr int kGatherWarps = 4;  // one warp per gathered row
constexpr int kAppendThreads = 128;
constexpr size_t kSharedLimit = 48 * 1024;  // what a kernel may take without opting in
// attend_kernel's static tiles, beside its dynamic shared memory.
constexpr size_t kAttendStaticShared =
    kAttendTile * (sizeof(float) + sizeof(const uint16_t*)) + kAttendWarps * sizeof(float);

__device__ __forceinline__ float bf16_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// Round to nearest, ties to even; every NaN becomes the canonical quiet NaN (as the host half does).
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block t stores row t.
__global__ void append_kernel(const float* rows, int64_t row_stride, const int64_t* slots, int64_t width,
                              uint16_t* pages) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const float* src = rows + t * row_stride;
  uint16_t* dst = pages + slot * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = float_to_bf16(src[i]);
}

// Block (r, h); dynamic shared memory: q [width], the output accumulator [latent_dim], and with a selection its
// listed positions [selected_width] and the visible ones among them [selected_width] (−1 where not).
__global__ void __launch_bounds__(kAttendThreads) attend_kernel(AttendParams p) {
  extern __shared__ float shared[];
  __shared__ float tile_weight[kAttendTile];
  __shared__ const uint16_t* tile_row[kAttendTile];
  __shared__ float warp_max[kAttendWarps];
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const int64_t L = p.latent_dim, width = p.latent_dim + p.rope_dim;
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
  // Candidate j is position j, or with a selection the j-th listed position.
  int64_t candidates = kv_len;
  if (p.selected) {
    candidates = p.selected_width;
    for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) listed[j] = p.selected[r * candidates + j];
    __syncthreads();
    // A position listed twice is one key: only its first listing counts.
    for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) {
      const int32_t t = listed[j];
      bool keep = t >= 0 && t < kv_len;
      for (int64_t k = 0; keep && k < j; ++k) keep = listed[k] != t;
      visible[j] = keep ? t : -1;
    }
  }
  __syncthreads();

  // Candidate j's cached row, or null where it is not a key. The same for every lane of a warp.
  auto row_of = [&](int64_t j) -> const uint16_t* {
    const int64_t t = p.selected ? visible[j] : j;
    if (t < 0) return nullptr;
    const int64_t slot = static_cast<int64_t>(table[t / p.block_size]) * p.block_size + t % p.block_size;
    return p.pages + slot * width;
  };
  // scale · q·row by one warp (every lane gets the sum).
  auto score = [&](const uint16_t* row) {
    float s = 0.0f;
    for (int64_t i = lane; i < width; i += kWarp) s += q[i] * bf16_to_float(row[i]);
    return warp_sum(s) * p.scale;
  };

  // Pass 1: the largest score (−inf where the query sees no key).
  float max_score = -INFINITY;
  for (int64_t j = warp; j < candidates; j += kAttendWarps) {
    const uint16_t* row = row_of(j);
    if (row) max_score = fmaxf(max_score, score(row));
  }
  if (lane == 0) warp_max[warp] = max_score;
  __syncthreads();
  max_score = warp_max[0];
  for (int w = 1; w < kAttendWarps; ++w) max_score = fmaxf(max_score, warp_max[w]);

  // Pass 2: tiles of keys; the warps weigh a tile, then every thread adds it to its own elements of acc.
  float sum = 0.0f;  // the same in every thread: each adds the same weights in the same order
  for (int64_t base = 0; base < candidates; base += kAttendTile) {
    for (int k = warp; k < kAttendTile; k += kAttendWarps) {
      const uint16_t* row = base + k < candidates ? row_of(base + k) : nullptr;
      const float weight = row ? expf(score(row) - max_score) : 0.0f;
      if (lane == 0) {
        tile_weight[k] = weight;
        tile_row[k] = row;
      }
    }
    __syncthreads();
    for (int k = 0; k < kAttendTile; ++k) {
      const uint16_t* row = tile_row[k];
      if (!row) continue;
      const float weight = tile_weight[k];
      sum += weight;
      for (int64_t i = threadIdx.x; i < L; i += blockDim.x) acc[i] += weight * bf16_to_float(row[i]);
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }

  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const int64_t o = (r * p.num_heads + h) * L;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
    const float v = acc[i] * inv;
    if (p.out) p.out[o + i] = v;
    if (p.out_bf16) p.out_bf16[o + i] = float_to_bf16(v);
  }
}

// Warp w of block (x, b) copies position x · kGatherWarps + w of sequence b.
__global__ void gather_kernel(const uint16_t* pages, int64_t block_size, int64_t width, const int32_t* block_tables,
                              int64_t max_blocks, const GatherSeq* seqs, uint16_t* out) {
  const GatherSeq s = seqs[blockIdx.y];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kGatherWarps + threadIdx.x / kWarp;
  if (t >= s.kv_len) return;
  const int32_t page = block_tables[static_cast<int64_t>(s.table_row) * max_blocks + t / block_size];
  const uint16_t* src = pages + (static_cast<int64_t>(page) * block_size + t % block_size) * width;
  uint16_t* dst = out + (s.key_start + t) * width;
  for (int64_t i = threadIdx.x % kWarp; i < width; i += kWarp) dst[i] = src[i];
}

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_append(const float* rows, int64_t row_stride, const int64_t* slots, int64_t n, int64_t width,
                          uint16_t* pages, void* stream) {
  if (n == 0) return nullptr;
  append_kernel<<<static_cast<unsigned>(n), kAppendThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      rows, row_stride, slots, width, pages);
  return launched();
}

const char* launch_attend(const AttendParams& p, void* stream) {
  if (p.num_queries == 0 || p.num_heads == 0) return nullptr;
  const int64_t listed = p.selected ? 2 * p.selected_width : 0;
  const size_t shared = static_cast<size_t>(2 * p.latent_dim + p.rope_dim) * sizeof(float) +
                        static_cast<size_t>(listed) * sizeof(int32_t);
  if (shared + kAttendStaticShared > kSharedLimit)
    return "latent, rope and selection too wide for the kernel's shared memory (48 KiB)";
  const dim3 grid(static_cast<unsigned>(p.num_queries), static_cast<unsigned>(p.num_heads));
  attend_kernel<<<grid, kAttendThreads, shared, static_cast<cudaStream_t>(stream)>>>(p);
  return launched();
}

const char* launch_gather(const uint16_t* pages, int64_t block_size, int64_t width, const int32_t* block_tables,
                          int64_t max_blocks, const GatherSeq* seqs, int64_t num_seqs, int64_t max_kv_len,
                          uint16_t* out, void* stream) {
  if (num_seqs == 0 || max_kv_len == 0) return nullptr;
  const dim3 grid(static_cast<unsigned>((max_kv_len + kGatherWarps - 1) / kGatherWarps),
                  static_cast<unsigned>(num_seqs));
  gather_kernel<<<grid, kGatherWarps * kWarp, 0, static_cast<cudaStream_t>(stream)>>>(
      pages, block_size, width, block_tables, max_blocks, seqs, out);
  return launched();
}

}  // namespace example_plugin

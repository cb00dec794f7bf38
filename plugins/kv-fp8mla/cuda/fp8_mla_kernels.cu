// The CUDA kernels of `fp8_ds_mla`, the plain form: correct, bit-exact with the host codec where the format is
// concerned (quantization), and simple (attention on CUDA cores, one block per query row and head, no split-KV).
// A tensor-core decode kernel reading the fp8 pages is the next step for speed (bench/RESULTS.md).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "fp8_mla_kernels.h"

namespace kiln::fp8mla {
namespace {

constexpr int kWarp = 32;
constexpr int kAppendThreads = 128;  // one thread per value of a 128-value tile
constexpr int kAttendThreads = 256;
constexpr int kAttendWarps = kAttendThreads / kWarp;
constexpr int kAttendTile = 32;
constexpr int kGatherWarps = 4;
constexpr size_t kSharedLimit = 48 * 1024;
constexpr size_t kAttendStaticShared =
    kAttendTile * (sizeof(float) + sizeof(const uint8_t*)) + kAttendWarps * sizeof(float);

__device__ __forceinline__ float bf16_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN, as the host
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

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
  __shared__ float warp_amax[kAppendThreads / kWarp];
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  const float* src = rows + t * row_stride;
  uint8_t* dst = pages + slot * s.row_bytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int64_t tile = 0; tile < s.tiles; ++tile) {
    const int64_t i = tile * 128 + threadIdx.x;
    const float x = i < s.latent ? src[i] : 0.0f;
    float amax = fabsf(x);
    for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) warp_amax[warp] = amax;
    __syncthreads();
    amax = warp_amax[0];
    for (int w = 1; w < kAppendThreads / kWarp; ++w) amax = fmaxf(amax, warp_amax[w]);
    __syncthreads();  // warp_amax is read before the next tile writes it
    const float scale = fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN);
    if (i < s.latent)
      dst[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
    if (threadIdx.x == 0) memcpy(dst + s.scales_offset + 4 * tile, &scale, 4);
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
  append_kernel<<<static_cast<unsigned>(n), kAppendThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      s, rows, row_stride, slots, pages);
  return launched();
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

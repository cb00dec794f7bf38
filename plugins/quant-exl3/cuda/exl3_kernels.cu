// The EXL3 kernels (see exl3_kernels.h for the pipeline and why it is shaped so).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "exl3_codebook_device.cuh"
#include "exl3_kernels.h"
#include "exl3_lane_states.h"

namespace kiln::exl3::cuda {
namespace {

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

template <class T>
__device__ __forceinline__ const T* pick(const PerRow<T>& p, int64_t row) {
  return p.fixed ? p.fixed : p.table[p.ids[row / p.ids_div]];
}

// The 128-point Sylvester butterflies over every 128-block of v[0..count) in shared memory, by all threads of the
// block, then × scale: each element sees the CPU reference's operations in its order (hadamard128 in
// exl3_tile.cpp), so results agree bit for bit. Callers synchronise before (v written) and after.
__device__ __forceinline__ void hadamard128_shared(float* v, int count, float scale) {
  for (int h = 1; h < kHadamardSize; h *= 2) {
    __syncthreads();
    for (int p = threadIdx.x; p < count / 2; p += blockDim.x) {
      const int base = (p / (kHadamardSize / 2)) * kHadamardSize, w = p % (kHadamardSize / 2);
      const int i = base + (w / h) * 2 * h + w % h;
      const float x = v[i], y = v[i + h];
      v[i] = __fadd_rn(x, y);
      v[i + h] = __fsub_rn(x, y);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < count; i += blockDim.x) v[i] = __fmul_rn(v[i], scale);
  __syncthreads();
}

// The lane's three stream words of a tile held across the warp (lane l has word l in `lo`, word l + 32 in `hi`).
template <int K>
__device__ __forceinline__ uint32_t word_from_warp(uint32_t lo, uint32_t hi, int index) {
  const uint32_t a = __shfl_sync(0xFFFFFFFFu, lo, index & 31);
  if constexpr (8 * K > 32) {
    const uint32_t b = __shfl_sync(0xFFFFFFFFu, hi, index & 31);
    return index >= 32 ? b : a;
  }
  return a;
}

template <int K, int CB>
__device__ __forceinline__ void decode_lane(uint32_t lo, uint32_t hi, int lane, int first, float (&w)[8]) {
  constexpr int kWords = 8 * K;
  const uint32_t w0 = word_from_warp<K>(lo, hi, first);
  const uint32_t w1 = word_from_warp<K>(lo, hi, (first + 1) % kWords);
  const uint32_t w2 = word_from_warp<K>(lo, hi, (first + 2) % kWords);
#pragma unroll
  for (int q = 0; q < 8; ++q) w[q] = decode_state(lane_state(w0, w1, w2, lane, q, K), CB);
}

constexpr int kGroupTiles = kHadamardSize / 16;  // a block's column tiles: one warp each, one output rotation
constexpr int kProductThreads = 32 * kGroupTiles;

template <int K, int CB, int G>
__global__ void __launch_bounds__(kProductThreads) trellis_product_kernel(ProductArgs a, int tiles_per_split) {
  constexpr int kWords = 8 * K;
  constexpr int kUnroll = K <= 4 ? 8 : 4;
  extern __shared__ float xs[];  // [G][len]: the rotated input slice
  __shared__ float fin[G * kHadamardSize];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * G;  // local
  const int rows = static_cast<int>(a.rows - row0 < G ? a.rows - row0 : G);
  const int64_t k_tiles = a.k_pad / 16, n_tiles = a.n_pad / 16;
  const int group = blockIdx.y, split = blockIdx.z;
  const int64_t j = static_cast<int64_t>(group) * kGroupTiles + warp;
  const int64_t i_begin = static_cast<int64_t>(split) * tiles_per_split;
  const int64_t i_end = k_tiles < i_begin + tiles_per_split ? k_tiles : i_begin + tiles_per_split;
  const int len = static_cast<int>(i_end - i_begin) * 16;  // a multiple of 128
  const int64_t q0 = a.row_begin + row0;                    // global row of local row 0
  const uint32_t* trellis = pick(a.trellis, q0);

  // 1. The first tiles' loads go out before the input slice is rotated, so the two latencies overlap.
  uint32_t lo[kUnroll], hi[kUnroll];
  auto load_chunk = [&](int64_t i) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      lo[u] = hi[u] = 0;
      if (i + u < i_end) {
        const uint32_t* tile = trellis + ((i + u) * n_tiles + j) * kWords;
        if (lane < kWords) lo[u] = __ldg(tile + lane);
        if (kWords > 32 && lane + 32 < kWords) hi[u] = __ldg(tile + lane + 32);
      }
    }
  };
  load_chunk(i_begin);
  for (int idx = threadIdx.x; idx < G * len; idx += blockDim.x) {
    const int r = idx / len;
    const int64_t k = i_begin * 16 + idx % len;
    float v = 0.0f;
    if (r < rows && k < a.in) {
      const int64_t q = q0 + r;
      if (a.gate) {  // an expert's SwiGLU, as the CPU computes it
        const float g = fminf(a.gate[q * a.in + k], a.swiglu_limit);
        const float u = fminf(fmaxf(a.up[q * a.in + k], -a.swiglu_limit), a.swiglu_limit);
        v = g / (1.0f + expf(-g)) * u;
      } else {
        v = __bfloat162float(__ushort_as_bfloat16(a.x_bf16[(q / a.x_div) * a.x_stride + k]));
      }
      v = __fmul_rn(v, pick(a.suh, q)[k]);
    }
    xs[idx] = v;
  }
  hadamard128_shared(xs, G * len, a.hadamard_scale);

  // 2. Decode and multiply.
  const int first = lane_first_word(lane, K);
  const int r0 = 2 * (lane & 3), c0 = lane >> 2;
  float acc[G][2];
#pragma unroll
  for (int r = 0; r < G; ++r) acc[r][0] = acc[r][1] = 0.0f;
  for (int64_t i = i_begin; i < i_end; i += kUnroll) {
    if (i != i_begin) load_chunk(i);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u >= i_end) break;  // uniform across the block
      float w[8];
      decode_lane<K, CB>(lo[u], hi[u], lane, first, w);
      const float* xb = xs + (i + u - i_begin) * 16;
#pragma unroll
      for (int r = 0; r < G; ++r) {
        const float* xr = xb + r * len;
        const float x0 = xr[r0], x1 = xr[r0 + 1], x2 = xr[r0 + 8], x3 = xr[r0 + 9];
        acc[r][0] = fmaf(x3, w[3], fmaf(x2, w[2], fmaf(x1, w[1], fmaf(x0, w[0], acc[r][0]))));
        acc[r][1] = fmaf(x3, w[7], fmaf(x2, w[6], fmaf(x1, w[5], fmaf(x0, w[4], acc[r][1]))));
      }
    }
  }
  // The four lanes of a column hold its sums over input rows r0 ∈ {0, 2, 4, 6} (+1, +8, +9): a symmetric butterfly
  // gives all four the same bits.
#pragma unroll
  for (int r = 0; r < G; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = acc[r][h];
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
      acc[r][h] = v;
    }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int r = 0; r < G; ++r) {
      if (r >= rows) break;
      float* dst = a.partial + (static_cast<int64_t>(split) * a.rows + row0 + r) * a.n_pad + j * 16 + c0;
      dst[0] = acc[r][0];
      dst[8] = acc[r][1];
    }
  }

  // 3. The last split block of this (row group, column group) finishes it.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.counters + blockIdx.x * gridDim.y + group;
    last = atomicAdd(counter, 1) == a.splits - 1;
    if (last) *counter = 0;  // ready for the next launch (stream order) or graph replay
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * kHadamardSize; idx += blockDim.x) {
    const int r = idx / kHadamardSize, c = idx % kHadamardSize;
    float sum = 0.0f;
    if (r < rows)
      for (int s = 0; s < a.splits; ++s)
        sum += __ldcg(a.partial + (static_cast<int64_t>(s) * a.rows + row0 + r) * a.n_pad + group * kHadamardSize + c);
    fin[idx] = sum;
  }
  hadamard128_shared(fin, G * kHadamardSize, a.hadamard_scale);
  for (int idx = threadIdx.x; idx < G * kHadamardSize; idx += blockDim.x) {
    const int r = idx / kHadamardSize;
    const int64_t col = static_cast<int64_t>(group) * kHadamardSize + idx % kHadamardSize;
    if (r >= rows || col >= a.out) continue;
    const int64_t q = q0 + r;
    float o = __fmul_rn(fin[idx], pick(a.svh, q)[col]);
    if (a.bias) o = __fadd_rn(o, a.bias[col]);
    if (a.row_weight) o = __fmul_rn(a.row_weight[q], o);
    const int64_t at = q * a.y_stride + a.col_offset + col;
    if (a.y_bf16) {
      auto* y = static_cast<__nv_bfloat16*>(a.y);
      y[at] = __float2bfloat16_rn(a.accumulate ? __bfloat162float(y[at]) + o : o);
    } else {
      auto* y = static_cast<float*>(a.y);
      y[at] = a.accumulate ? y[at] + o : o;
    }
  }
}

template <int K, int CB, int G>
const char* launch_product_kgc(const ProductArgs& a, cudaStream_t st) {
  // Whole 128-input blocks per split: each rotates its own slice.
  const int64_t k_blocks = a.k_pad / kHadamardSize;
  const int tps = static_cast<int>((k_blocks + a.splits - 1) / a.splits) * (kHadamardSize / 16);
  const dim3 grid(static_cast<unsigned>((a.rows + G - 1) / G), static_cast<unsigned>(a.n_pad / kHadamardSize),
                  static_cast<unsigned>(a.splits));
  const size_t smem = static_cast<size_t>(G) * tps * 16 * sizeof(float);
  trellis_product_kernel<K, CB, G><<<grid, kProductThreads, smem, st>>>(a, tps);
  return launched();
}

template <int K, int G>
const char* launch_product_kg(const ProductArgs& a, cudaStream_t st) {
  switch (a.codebook) {
    case kCb3Inst: return launch_product_kgc<K, kCb3Inst, G>(a, st);
    case kCbMcg: return launch_product_kgc<K, kCbMcg, G>(a, st);
    case kCbMul1: return launch_product_kgc<K, kCbMul1, G>(a, st);
  }
  return "unknown EXL3 codebook";
}

template <int G>
const char* launch_product_g(const ProductArgs& a, cudaStream_t st) {
  switch (a.bits) {
    case 1: return launch_product_kg<1, G>(a, st);
    case 2: return launch_product_kg<2, G>(a, st);
    case 3: return launch_product_kg<3, G>(a, st);
    case 4: return launch_product_kg<4, G>(a, st);
    case 5: return launch_product_kg<5, G>(a, st);
    case 6: return launch_product_kg<6, G>(a, st);
    case 7: return launch_product_kg<7, G>(a, st);
    case 8: return launch_product_kg<8, G>(a, st);
  }
  return "EXL3 K outside 1..8";
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

int product_splits(int64_t k_pad, int64_t n_pad, int sm_count) {
  const int64_t k_tiles = k_pad / 16, k_blocks = k_pad / kHadamardSize, groups = n_pad / kHadamardSize;
  // About four blocks per SM for one row, each split whole 128-input blocks (its own input rotation), at most
  // kMaxTilesPerSplit tiles.
  const int64_t want = std::max<int64_t>(1, (4 * std::max(sm_count, 1) + groups - 1) / groups);
  const int64_t least = (k_tiles + kMaxTilesPerSplit - 1) / kMaxTilesPerSplit;
  const int64_t splits = std::clamp<int64_t>(want, least, k_blocks);
  const int64_t blocks_per_split = (k_blocks + splits - 1) / splits;
  return static_cast<int>((k_blocks + blocks_per_split - 1) / blocks_per_split);  // none empty
}

int64_t product_counters(int64_t n_pad) { return kMaxPassRows * (n_pad / kHadamardSize); }

const char* trellis_product(const ProductArgs& a, int rows_per_block, void* stream) {
  if (a.rows <= 0) return nullptr;
  if (a.rows > kMaxPassRows) return "trellis_product: more rows than one pass takes";
  switch (rows_per_block) {
    case 1: return launch_product_g<1>(a, as_stream(stream));
    case 4: return launch_product_g<4>(a, as_stream(stream));
    case 8: return launch_product_g<8>(a, as_stream(stream));
  }
  return "trellis_product: rows per block must be 1, 4 or 8";
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

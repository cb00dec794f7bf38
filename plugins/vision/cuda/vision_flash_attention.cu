#include "vision_flash_attention.h"

#include <algorithm>
#include <cfloat>

#include "kiln/cuda/warp_mma.cuh"

namespace kiln::vision::cuda {
namespace {

using kiln::cuda::cp_async_16;
using kiln::cuda::cp_async_commit;
using kiln::cuda::cp_async_wait;
using kiln::cuda::ldmatrix_x4_trans;
using kiln::cuda::mma_bf16_16816;
using kiln::cuda::pack_bf16x2;  // the split kernel's packing

constexpr int kKeys = 64;  // keys per shared-memory tile
constexpr int kPad = 8;    // bf16 elements of row padding: rows 16 B off the bank period, so every fragment read and
                           // ldmatrix row of a warp hits distinct banks

// 2^x on the SFU (ex2.approx, flushing denormals): exp2f's denormal handling costs instructions the softmax, whose
// inputs are ≤ 0 and whose tiny results do not matter next to the row's largest, has no use for.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as one bf16x2 register in one conversion instruction (round to nearest even, first in the low half).
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The frame's q, k and v as bf16, each [heads][len][hd] (a head's rows contiguous, so a key tile is one run of
// memory that cp.async streams 16 bytes at a time). One thread per 4 channels.
__global__ void split_qkv_kernel(const float* __restrict__ qkv, __nv_bfloat16* __restrict__ dst, int64_t start,
                                 int64_t len, int heads, int hd) {
  const int64_t h = static_cast<int64_t>(heads) * hd, quads = len * 3 * h / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < quads;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * 4, row = e / (3 * h), col = e % (3 * h);
    const int64_t part = col / h, head = (col % h) / hd, c = col % hd;
    const float4 v = *reinterpret_cast<const float4*>(qkv + (start + row) * 3 * h + col);
    uint2 packed;
    packed.x = pack_bf16x2(v.x, v.y);
    packed.y = pack_bf16x2(v.z, v.w);
    *reinterpret_cast<uint2*>(dst + ((part * heads + head) * len + row) * hd + c) = packed;
  }
}

// Each warp owns 16 queries (scores, running softmax and output in registers); the block's warps share key/value
// tiles, double-buffered: tile i + 1 is in flight (cp.async) while tile i is multiplied.
template <int HD, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    flash_kernel(const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,
                 const __nv_bfloat16* __restrict__ vb, float* __restrict__ out, int64_t start, int len, int heads,
                 float scale_log2) {
  constexpr int kRow = HD + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* tiles = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [stage][k | v][kKeys][kRow]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int head = blockIdx.y;
  const int64_t head_rows = static_cast<int64_t>(head) * len;
  const __nv_bfloat16* kh = kb + head_rows * HD;
  const __nv_bfloat16* vh = vb + head_rows * HD;

  auto load_tile = [&](int k0, int stage) {
    __nv_bfloat16* ks = tiles + stage * 2 * kKeys * kRow;
    __nv_bfloat16* vs = ks + kKeys * kRow;
    constexpr int kChunks = kKeys * HD / 8;  // 16-byte pieces per matrix
    for (int i = threadIdx.x; i < kChunks; i += 32 * kWarps) {
      const int key = i / (HD / 8), c = (i % (HD / 8)) * 8;
      const bool valid = k0 + key < len;
      const int64_t src = static_cast<int64_t>(valid ? k0 + key : 0) * HD + c;
      cp_async_16(ks + key * kRow + c, kh + src, valid);
      cp_async_16(vs + key * kRow + c, vh + src, valid);
    }
  };

  const int tiles_n = (len + kKeys - 1) / kKeys;
  load_tile(0, 0);
  cp_async_commit();

  // This warp's 16 queries as A fragments, straight from global memory (rows past the frame: the last row).
  const int q0 = blockIdx.x * 16 * kWarps + warp * 16;
  uint32_t qa[HD / 16][4];
  {
    const __nv_bfloat16* qa_row = qb + (head_rows + min(q0 + g, len - 1)) * HD;
    const __nv_bfloat16* qb_row = qb + (head_rows + min(q0 + g + 8, len - 1)) * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      qa[kk][0] = *reinterpret_cast<const uint32_t*>(qa_row + c);
      qa[kk][1] = *reinterpret_cast<const uint32_t*>(qb_row + c);
      qa[kk][2] = *reinterpret_cast<const uint32_t*>(qa_row + c + 8);
      qa[kk][3] = *reinterpret_cast<const uint32_t*>(qb_row + c + 8);
    }
  }
  float o[HD / 8][4] = {};
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < tiles_n; ++tile) {
    const int k0 = tile * kKeys;
    if (tile + 1 < tiles_n) {
      load_tile(k0 + kKeys, (tile + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ks = tiles + (tile & 1) * 2 * kKeys * kRow;
    const __nv_bfloat16* vs = ks + kKeys * kRow;

    // Scores of the warp's 16 rows against the tile's 64 keys: 8 accumulator tiles of 16 × 8.
    float s[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(ks + (j * 8 + g) * kRow + kk * 16 + 2 * t);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(ks + (j * 8 + g) * kRow + kk * 16 + 2 * t + 8);
        mma_bf16_16816(s[j], qa[kk], b0, b1);
      }
    }
    // Online softmax in base 2: the running max m is kept scaled (scale · log2 e folded in), so each probability is
    // one FFMA and one MUFU.EX2; keys past the frame (the last tile only) out.
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
    if (k0 + kKeys > len) {
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + j * 8 + 2 * t + (e & 1) >= len) s[j][e] = -FLT_MAX;
    }
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
    float alpha[2], m_neg[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r] * scale_log2);
      alpha[r] = fast_exp2(m[r] - m_new);
      m[r] = m_new;
      m_neg[r] = -m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, m_neg[e / 2]));
        l[e / 2] += s[j][e];
      }
    // O += P·V: the probabilities as A fragments (two score tiles make 16 keys); the value B fragments come from
    // the row-major tile through ldmatrix.trans, two 8-channel column groups per load.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                              pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int mat = lane / 8, r = lane % 8;
      const __nv_bfloat16* vrow = vs + (kk * 16 + (mat & 1) * 8 + r) * kRow + (mat >> 1) * 8;
#pragma unroll
      for (int j = 0; j < HD / 8; j += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vrow + j * 8);
        mma_bf16_16816(o[j], pa, b[0], b[1]);
        mma_bf16_16816(o[j + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's copy
  }
  // Each row's sum over the quad's threads, then the normalised rows out.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int64_t h = static_cast<int64_t>(heads) * HD;
  const int rows[2] = {q0 + g, q0 + g + 8};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= len) continue;
    const float inv = 1.0f / l[r];
    float* dst = out + (start + rows[r]) * h + static_cast<int64_t>(head) * HD;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<float2*>(dst + j * 8 + 2 * t) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

template <int HD, int kWarps>
cudaError_t launch_warps(const __nv_bfloat16* q, float* out, int64_t start, int64_t len, int64_t heads, float scale,
                         cudaStream_t stream) {
  constexpr size_t kSmem = 2 * 2 * kKeys * (HD + kPad) * sizeof(__nv_bfloat16);
  // Per call: the attribute belongs to the current device's context, and setting it costs next to nothing.
  if (cudaError_t e = cudaFuncSetAttribute(flash_kernel<HD, kWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmem));
      e != cudaSuccess)
    return e;
  const int64_t per_head = len * HD;
  const dim3 grid(static_cast<unsigned>((len + 16 * kWarps - 1) / (16 * kWarps)), static_cast<unsigned>(heads));
  flash_kernel<HD, kWarps><<<grid, 32 * kWarps, kSmem, stream>>>(
      q, q + heads * per_head, q + 2 * heads * per_head, out, start, static_cast<int>(len), static_cast<int>(heads),
      scale * 1.4426950408889634f);
  return cudaGetLastError();
}

// 8 warps (128 queries) share each key tile when the frame gives every SM at least one such block; smaller frames
// take 4 warps so the grid still covers the GPU.
template <int HD>
cudaError_t launch(const __nv_bfloat16* q, float* out, int64_t start, int64_t len, int64_t heads, float scale,
                   cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if ((len + 127) / 128 * heads >= sms) return launch_warps<HD, 8>(q, out, start, len, heads, scale, stream);
  return launch_warps<HD, 4>(q, out, start, len, heads, scale, stream);
}

}  // namespace

bool flash_attention_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

size_t flash_attention_workspace_bytes(int64_t len, int64_t heads, int64_t head_dim) {
  return static_cast<size_t>(3 * len * heads * head_dim) * sizeof(__nv_bfloat16);
}

cudaError_t flash_attention_frame(const float* qkv, float* out, int64_t start, int64_t len, int64_t heads,
                                  int64_t head_dim, float scale, void* workspace, cudaStream_t stream) {
  if (len <= 0) return cudaSuccess;
  if (!flash_attention_supported(head_dim)) return cudaErrorInvalidValue;
  auto* q = static_cast<__nv_bfloat16*>(workspace);
  const int64_t quads = len * 3 * heads * head_dim / 4;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((quads + threads - 1) / threads, 65535));
  split_qkv_kernel<<<blocks, threads, 0, stream>>>(qkv, q, start, len, static_cast<int>(heads),
                                                   static_cast<int>(head_dim));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  switch (head_dim) {
    case 16: return launch<16>(q, out, start, len, heads, scale, stream);
    case 32: return launch<32>(q, out, start, len, heads, scale, stream);
    case 64: return launch<64>(q, out, start, len, heads, scale, stream);
    default: return launch<128>(q, out, start, len, heads, scale, stream);
  }
}

}  // namespace kiln::vision::cuda

#include "vision_flash_attention.h"

#include <cfloat>

#include "kiln/cuda/warp_mma.cuh"

namespace kiln::vision::cuda {
namespace {

using kiln::cuda::mma_bf16_16816;
using kiln::cuda::pack_bf16x2;

constexpr int kWarps = 4;
constexpr int kQueries = 16 * kWarps;  // per block: 16 rows per warp
constexpr int kKeys = 64;              // per shared-memory tile
constexpr int kPad = 8;                // bf16 elements of row padding against bank conflicts

template <int HD>
__global__ void __launch_bounds__(32 * kWarps) flash_kernel(const float* __restrict__ qkv, float* __restrict__ out,
                                                            int64_t start, int len, int heads, float scale_log2) {
  __shared__ __align__(16) __nv_bfloat16 ks[kKeys][HD + kPad];   // keys, row per key
  __shared__ __align__(16) __nv_bfloat16 vt[HD][kKeys + kPad];   // values transposed, row per channel
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int head = blockIdx.y;
  const int64_t h = static_cast<int64_t>(heads) * HD, row_stride = 3 * h;
  const float* base = qkv + start * row_stride + static_cast<int64_t>(head) * HD;

  // This warp's 16 queries as A fragments (rows g and g + 8 of the warp's tile), rounded to bf16 once.
  const int q0 = blockIdx.x * kQueries + warp * 16;
  uint32_t qa[HD / 16][4];
  {
    const int ra = min(q0 + g, len - 1), rb = min(q0 + g + 8, len - 1);  // rows past the frame: any valid row
    const float* qa_row = base + ra * row_stride;
    const float* qb_row = base + rb * row_stride;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      qa[kk][0] = pack_bf16x2(qa_row[c], qa_row[c + 1]);
      qa[kk][1] = pack_bf16x2(qb_row[c], qb_row[c + 1]);
      qa[kk][2] = pack_bf16x2(qa_row[c + 8], qa_row[c + 9]);
      qa[kk][3] = pack_bf16x2(qb_row[c + 8], qb_row[c + 9]);
    }
  }
  float o[HD / 8][4] = {};
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};

  for (int k0 = 0; k0 < len; k0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    // Keys and values of the tile, fp32 → bf16 (four channels per load; keys past the frame as zeros).
    for (int i = threadIdx.x; i < kKeys * HD / 4; i += 32 * kWarps) {
      const int key = i / (HD / 4), c = (i % (HD / 4)) * 4;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (k0 + key < len) {
        const float* r = base + static_cast<int64_t>(k0 + key) * row_stride;
        kv = *reinterpret_cast<const float4*>(r + h + c);
        vv = *reinterpret_cast<const float4*>(r + 2 * h + c);
      }
      ks[key][c] = __float2bfloat16_rn(kv.x), ks[key][c + 1] = __float2bfloat16_rn(kv.y);
      ks[key][c + 2] = __float2bfloat16_rn(kv.z), ks[key][c + 3] = __float2bfloat16_rn(kv.w);
      vt[c][key] = __float2bfloat16_rn(vv.x), vt[c + 1][key] = __float2bfloat16_rn(vv.y);
      vt[c + 2][key] = __float2bfloat16_rn(vv.z), vt[c + 3][key] = __float2bfloat16_rn(vv.w);
    }
    __syncthreads();

    // Scores of the warp's 16 rows against the tile's 64 keys: 8 accumulator tiles of 16 × 8.
    float s[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ks[j * 8 + g][kk * 16 + 2 * t]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ks[j * 8 + g][kk * 16 + 2 * t + 8]);
        mma_bf16_16816(s[j], qa[kk], b0, b1);
      }
    }
    // Online softmax in base 2 (scale folded with log2 e); keys past the frame out.
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t + (e & 1);
        s[j][e] = key < len ? s[j][e] * scale_log2 : -FLT_MAX;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - m[e / 2]);
        l[e / 2] += s[j][e];
      }
    // O += P·V: the probabilities as A fragments (two score tiles make 16 keys), values from the transposed tile.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&vt[j * 8 + g][kk * 16 + 2 * t]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&vt[j * 8 + g][kk * 16 + 2 * t + 8]);
        mma_bf16_16816(o[j], pa, b0, b1);
      }
    }
  }
  // Each row's sum over the quad's threads, then the normalised rows out.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
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

template <int HD>
cudaError_t launch(const float* qkv, float* out, int64_t start, int64_t len, int64_t heads, float scale,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((len + kQueries - 1) / kQueries), static_cast<unsigned>(heads));
  flash_kernel<HD><<<grid, 32 * kWarps, 0, stream>>>(qkv, out, start, static_cast<int>(len), static_cast<int>(heads),
                                                     scale * 1.4426950408889634f);
  return cudaGetLastError();
}

}  // namespace

bool flash_attention_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

cudaError_t flash_attention_frame(const float* qkv, float* out, int64_t start, int64_t len, int64_t heads,
                                  int64_t head_dim, float scale, cudaStream_t stream) {
  if (len <= 0) return cudaSuccess;
  switch (head_dim) {
    case 16: return launch<16>(qkv, out, start, len, heads, scale, stream);
    case 32: return launch<32>(qkv, out, start, len, heads, scale, stream);
    case 64: return launch<64>(qkv, out, start, len, heads, scale, stream);
    case 128: return launch<128>(qkv, out, start, len, heads, scale, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::vision::cuda

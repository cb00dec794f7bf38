// The fp8_ds_mla append with the MLA prologue fused in (kKvFuseNormRope | kKvFuseQueries): one launch ropes the
// query heads and the latent's rope part, normalises the latent and quantizes the row into its slot — the step
// between MLA's projections and the query absorption, which the core otherwise runs as its own kernel before the
// layout's append (one launch and one round trip of the row through memory more, on every layer of every decode
// step). The prologue is the SDK's (kiln/cuda/mla_append_row.cuh, the core's own pieces), the quantization
// append_kernel's, so the stored bytes are what the two launches store, bit for bit.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstring>

#include "fp8_mla_row_store.cuh"
#include "fp8_mla_kernels.h"
#include "kiln/cuda/mla_append_row.cuh"
#include "kiln/cuda/pdl_launch.cuh"
#include "kiln/cuda/warp_mma.cuh"  // pdl_wait, pdl_launch_dependents

namespace kiln::fp8mla {
namespace {

using kiln::cuda::kMlaAppendLatentPerThread;
using kiln::cuda::kMlaAppendThreads;

// Block (t, h < heads): query head h of token t; block (t, heads): token t's row. With hs > 0 (the SDK's prefill
// form, mla_append_wide_heads) block (t, y < gridDim.y − 1) takes query heads y·hs .. of token t instead. Thread i
// holds latent elements i + 128·j, so tile j's values are x[j] across the block: thread i takes value i of every
// tile, as append_kernel.
__global__ void __launch_bounds__(kMlaAppendThreads) fused_append_kernel(RowShape s, FusedAppend a, uint8_t* pages,
                                                                         int64_t hs) {
  kiln::cuda::pdl_wait();
  kiln::cuda::pdl_launch_dependents();
  const int64_t t = blockIdx.x, h = blockIdx.y, query_blocks = hs > 0 ? gridDim.y - 1 : a.heads;
  const float position = a.positions ? static_cast<float>(a.positions[t]) : 0.0f;
  const int half = a.positions ? static_cast<int>(s.rope / 2) : 0;
  const int tid = static_cast<int>(threadIdx.x);
  if (h < query_blocks) {
    const int64_t qk = a.nope + s.rope, D = s.latent + s.rope;
    if (hs > 0) {
      const int64_t h0 = h * hs;
      kiln::cuda::mla_append_query_heads(a.q + (t * a.heads + h0) * qk, a.q_bf + (t * a.heads + h0) * qk,
                                         a.q_abs ? a.q_abs + (t * a.heads + h0) * D : nullptr, min(hs, a.heads - h0),
                                         a.nope, s.rope, s.latent, position, a.inv_freq, a.rope_factor);
    } else {
      kiln::cuda::mla_append_query_head(a.q + (t * a.heads + h) * qk, a.q_bf + (t * a.heads + h) * qk,
                                        a.q_abs ? a.q_abs + (t * a.heads + h) * D + s.latent : nullptr, a.nope,
                                        s.rope, position, a.inv_freq, a.rope_factor, half);
    }
    return;
  }
  float* row = a.rows + t * a.row_stride;
  float x[kMlaAppendLatentPerThread], w[kMlaAppendLatentPerThread];
  float lo, hi;
  kiln::cuda::mla_append_latent_load_rope(row, s.latent, a.norm_weight, position, a.inv_freq, a.rope_factor, half, x,
                                          w, lo, hi);
  const int64_t slot = a.slots[t];
  if (slot < 0) return;  // padding (the whole block)
  const float inv = kiln::cuda::mla_append_latent_scale(s.latent, a.norm_weight != nullptr, a.eps, x);
  uint8_t* dst = pages + slot * s.row_bytes;
  __shared__ float warp_amax[kTileThreads / 32];
  static_assert(kTileThreads == kMlaAppendThreads, "thread i holds value i of every tile");
#pragma unroll
  for (int j = 0; j < kMlaAppendLatentPerThread; ++j) {
    if (j >= s.tiles) break;
    const int64_t i = j * int64_t{128} + tid;
    const float v = i < s.latent ? (a.norm_weight ? x[j] * inv * w[j] : x[j]) : 0.0f;
    quantize_tile(v, i < s.latent, warp_amax, dst + i, dst + s.scales_offset + 4 * j);
  }
  auto store_rope = [&](int64_t i, float r) {
    const uint16_t b = float_to_bf16(r);
    memcpy(dst + s.rope_offset + 2 * i, &b, 2);
  };
  if (half > 0) {
    if (tid < half) store_rope(tid, lo), store_rope(half + tid, hi);
  } else {
    for (int64_t i = tid; i < s.rope; i += blockDim.x) store_rope(i, row[s.latent + i]);
  }
  for (int64_t i = s.rope_offset + 2 * s.rope + tid; i < s.row_bytes; i += blockDim.x) dst[i] = 0;  // padding
}

}  // namespace

bool fused_append_supported(const RowShape& s) {
  return s.latent > 0 && s.latent <= int64_t{kMlaAppendLatentPerThread} * kMlaAppendThreads && s.rope >= 0 &&
         s.rope % 2 == 0 && s.rope / 2 <= kMlaAppendThreads;
}

const char* launch_fused_append(const RowShape& s, const FusedAppend& a, uint8_t* pages, void* stream) {
  if (!fused_append_supported(s)) return "latent or rope width outside the fused append's block (latent ≤ 1,024)";
  if (a.n == 0) return nullptr;
  if (a.heads < 0 || a.heads > 65534) return "query heads must be in [0, 65535)";
  static const bool pdl = kiln::cuda::pdl_supported_on_current_device();
  const int64_t hs = a.q ? kiln::cuda::mla_append_wide_heads(a.n, a.heads, a.nope, s.rope, s.latent,
                                                               a.positions != nullptr, a.q, a.q_bf, a.q_abs)
                         : 0;
  const int64_t query_blocks = hs > 0 ? (a.heads + hs - 1) / hs : a.heads;
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(query_blocks + 1));
  const cudaError_t e = kiln::cuda::launch_with_pdl(fused_append_kernel, grid, dim3(kMlaAppendThreads), 0,
                                                    static_cast<cudaStream_t>(stream), pdl, s, a, pages, hs);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kiln::fp8mla

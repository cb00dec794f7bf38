// What the grouped expert GEMMs (moe_grouped_gemm.cu, moe_grouped_gemm_sm90.cu) share: how a CTA finds its
// (expert, row block) from expert_offsets alone — so the grid needs only an upper bound on the tile count, the
// launch needs no host sync and captures into a CUDA graph — and the SwiGLU their gate_up epilogues apply.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::cuda {

struct GroupedTile {
  int expert;  // −1: past the last tile
  int m0;      // first row within the expert's group
};

// The tile-th (expert, row block) in expert order, by a warp scan over the per-expert block counts. Every lane of
// the calling warp gets the same answer.
template <int kBlockM>
__device__ GroupedTile find_grouped_tile(const int32_t* __restrict__ offsets, int experts, int tile) {
  const int lane = threadIdx.x % 32;
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int count = e < experts ? (offsets[e + 1] - offsets[e] + kBlockM - 1) / kBlockM : 0;
    int incl = count;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int v = __shfl_up_sync(~0u, incl, off);
      if (lane >= off) incl += v;
    }
    const unsigned hit = __ballot_sync(~0u, tile < incl);
    if (hit) {
      const int src = __ffs(hit) - 1;
      const int before = __shfl_sync(~0u, incl - count, src);
      return {base + src, (tile - before) * kBlockM};
    }
    tile -= __shfl_sync(~0u, incl, 31);
  }
  return {-1, 0};
}

// As cpu::swiglu: silu(min(gate, limit)) · clamp(up, ±limit).
__device__ __forceinline__ float grouped_swiglu(float gate, float up, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return g / (1.0f + expf(-g)) * u;
}

// Σ_e ⌈m_e / block_m⌉ ≤ ⌈pairs / block_m⌉ + (experts with pairs) − 1.
inline int64_t grouped_row_block_bound(int64_t pairs, int64_t num_experts, int block_m) {
  return (pairs + block_m - 1) / block_m + std::min(pairs, num_experts);
}

}  // namespace kiln::cuda

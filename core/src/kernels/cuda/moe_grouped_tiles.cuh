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

// Expert e holds units(m_e) units (m_e: its rows); the unit-th of them in expert order, by a warp scan over the
// experts: {expert, the unit's index within it}, or {−1, unit − total units} past the last. Every lane of the calling
// warp gets the same answer.
template <class Units>
__device__ int2 find_expert_unit(const int32_t* __restrict__ offsets, int experts, int unit, Units units) {
  const int lane = threadIdx.x % 32;
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int count = e < experts ? units(offsets[e + 1] - offsets[e]) : 0;
    int incl = count;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int v = __shfl_up_sync(~0u, incl, off);
      if (lane >= off) incl += v;
    }
    const unsigned hit = __ballot_sync(~0u, unit < incl);
    if (hit) {
      const int src = __ffs(hit) - 1;
      const int before = __shfl_sync(~0u, incl - count, src);
      return make_int2(base + src, unit - before);
    }
    unit -= __shfl_sync(~0u, incl, 31);
  }
  return make_int2(-1, unit);
}

// The tile-th (expert, row block) in expert order.
template <int kBlockM>
__device__ GroupedTile find_grouped_tile(const int32_t* __restrict__ offsets, int experts, int tile) {
  const int2 u = find_expert_unit(offsets, experts, tile, [](int m) { return (m + kBlockM - 1) / kBlockM; });
  return {u.x, u.x < 0 ? 0 : u.y * kBlockM};
}

// Tiles for clusters of two CTAs. First every expert's row blocks two by two — (0, 1), (2, 3), ... — one pair a
// cluster, rank r taking the pair's block r: both multiply by the same weight tiles (`multicast`). Then the odd
// blocks left (an expert's last when its count is odd), two a cluster, each CTA its own expert's; past those,
// expert −1. Both ranks of a cluster agree on `multicast`, and a multicast pair never has an empty rank.
struct PairedTile {
  int expert;
  int m0;
  bool multicast;
};

template <int kBlockM>
__device__ PairedTile find_paired_tile(const int32_t* __restrict__ offsets, int experts, int cluster, int rank) {
  const auto blocks = [](int m) { return (m + kBlockM - 1) / kBlockM; };
  const int2 pair = find_expert_unit(offsets, experts, cluster, [&](int m) { return blocks(m) / 2; });
  if (pair.x >= 0) return {pair.x, (2 * pair.y + rank) * kBlockM, true};
  const int2 odd = find_expert_unit(offsets, experts, 2 * pair.y + rank, [&](int m) { return blocks(m) % 2; });
  if (odd.x < 0) return {-1, 0, false};
  return {odd.x, (blocks(offsets[odd.x + 1] - offsets[odd.x]) - 1) * kBlockM, false};
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

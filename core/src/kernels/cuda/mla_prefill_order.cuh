// The MLA prefill kernels' block order (MlaPrefillParams::heads_fastest / head_group): which (query tile, head) a
// block takes, and the grid that covers them. Both tensor-core kernels (mla_prefill.cu, mla_prefill_sm90.cu) use
// it, so the order is one rule; within a head the longest query tiles (the most keys) always come first.
#pragma once

#include <algorithm>

#include "kernels/cuda/mla_prefill.h"

namespace kiln::cuda {

struct MlaPrefillBlock {
  int m_tile, head;
};

inline dim3 mla_prefill_grid(const MlaPrefillParams& p, int block_m) {
  const unsigned heads = static_cast<unsigned>(p.num_heads);
  const unsigned tiles = static_cast<unsigned>((p.max_q_len + block_m - 1) / block_m);
  const unsigned seqs = static_cast<unsigned>(p.num_seqs);
  if (p.head_group > 0) return dim3(heads * tiles, 1, seqs);
  return p.heads_fastest ? dim3(heads, tiles, seqs) : dim3(tiles, heads, seqs);
}

__device__ __forceinline__ MlaPrefillBlock mla_prefill_block(const MlaPrefillParams& p) {
  if (p.head_group > 0) {
    // Groups of head_group heads, one after another; inside a group the tiles longest first, heads fastest. The last
    // group may be smaller.
    const int heads = static_cast<int>(p.num_heads), tiles = static_cast<int>(gridDim.x) / heads;
    const int group = static_cast<int>(p.head_group), b = static_cast<int>(blockIdx.x);
    const int g = b / (group * tiles), g0 = g * group, size = min(group, heads - g0), r = b - g * group * tiles;
    return {tiles - 1 - r / size, g0 + r % size};
  }
  if (p.heads_fastest) return {static_cast<int>(gridDim.y) - 1 - static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x)};
  return {static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
}

}  // namespace kiln::cuda

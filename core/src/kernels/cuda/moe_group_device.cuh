// Device code shared by the grouping kernels (moe_experts.cu, moe_route_group.cu): one block of
// kGroupThreads threads turns the router's ids into the MoeDispatch lists.
#pragma once

#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "kernels/cuda/moe_experts.h"

namespace kiln::cuda::moe_detail {

inline constexpr int kGroupThreads = 1024;  // one thread per expert: E ≤ 1024

// A one-block route + group kernel routes with this many of its warps, each with its prob / choice rows in
// shared memory (2·E floats): E ≤ 1024 still gets 12 warps.
inline constexpr size_t kRouteSmemBudget = 96 * 1024;
inline int route_warps(int experts) {
  return static_cast<int>(
      std::clamp<size_t>(kRouteSmemBudget / (size_t(experts) * 2 * sizeof(float)), 1, kGroupThreads / 32));
}
using GroupScan = cub::BlockScan<int, kGroupThreads>;

struct GroupSmem {
  typename GroupScan::TempStorage scan;
  int counts[kGroupThreads];
};

// Counts, offsets and the active list by block scans; then thread e lists its own pairs in pair order
// (deterministic, O(pairs) per expert: decode has a few hundred pairs). `ids` may have been written by this
// block before a __syncthreads (so it is read through the coherent path).
__device__ __forceinline__ void group_pairs(const int32_t* ids, int64_t pairs, int experts, const MoeDispatch& d,
                                            GroupSmem& s) {
  const int e = threadIdx.x;
  s.counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int id = ids[p];
    if (id >= 0 && id < experts) atomicAdd(&s.counts[id], 1);
  }
  __syncthreads();
  const int count = e < experts ? s.counts[e] : 0;
  int offset = 0, total = 0;
  GroupScan(s.scan).ExclusiveSum(count, offset, total);
  __syncthreads();
  int rank = 0;
  GroupScan(s.scan).ExclusiveSum(count > 0 ? 1 : 0, rank);
  if (e < experts) {
    d.expert_offsets[e] = offset;
    d.active_experts[e] = -1;
  }
  if (e == 0) d.expert_offsets[experts] = total;
  __syncthreads();
  if (e < experts && count > 0) {
    d.active_experts[rank] = e;
    int out = offset;
    for (int64_t p = 0; p < pairs; ++p)
      if (ids[p] == e) d.pair_order[out++] = static_cast<int32_t>(p);
  }
}

}  // namespace kiln::cuda::moe_detail

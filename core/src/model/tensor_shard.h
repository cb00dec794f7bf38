// Which part of a tensor-parallel group's work one rank owns. Work is split in whole units (attention heads, MLP
// intermediate columns, routed experts, vocabulary rows): rank r of W owns units [⌊r·U/W⌋, ⌊(r+1)·U/W⌋), so
// counts that W does not divide split unevenly rather than being refused (3 heads over 2 ranks: 1 and 2).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln {

struct TensorShard {
  int rank = 0;
  int world = 1;

  bool sharded() const { return world > 1; }
  int64_t begin(int64_t units) const { return units * rank / world; }
  int64_t end(int64_t units) const { return units * (rank + 1) / world; }
  int64_t count(int64_t units) const { return end(units) - begin(units); }
  // The most units any rank owns: gathers pad every rank's part to this many.
  int64_t max_count(int64_t units) const { return (units + world - 1) / world; }
  bool owns(int64_t unit, int64_t units) const { return unit >= begin(units) && unit < end(units); }
};

// The rank that holds the MoE shared expert whole (runtime/cuda/gpu_weights.h): the last (rank 0 also selects
// tokens and runs the scheduler). The memory model (engine/rank_weights.h) counts it there.
inline int shared_expert_rank(const TensorShard& shard) { return shard.world - 1; }

}  // namespace kiln

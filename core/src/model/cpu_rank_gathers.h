// What the CPU models' tensor-parallel ranks (MlaMoeModel, glm5_next's Glm5NextModel) gather from each other on the
// host: rows split by units (heads, vocabulary), and embedding rows read on the rank that holds them. Both are
// copies through all_gather, so every rank ends with exactly the values one rank would have computed.
#pragma once

#include <cstdint>

#include "kiln/collective.h"
#include "kiln/status.h"
#include "kiln/tensor.h"
#include "model/tensor_shard.h"

namespace kiln {

// `local` holds n rows of this rank's shard.count(units) units × `width`; `full` gets n rows of all `units` × width,
// each rank's units at their place. `collective` null (one rank, or a rank not sharded): a copy.
Status gather_rank_units(Collective* collective, const TensorShard& shard, const float* local, int64_t n,
                         int64_t units, int64_t width, float* full);

// The fp32 embedding rows (n × hidden) of `ids`: `embed` holds `shard`'s rows of a `vocab`-row table, F32, BF16 or
// F16; with `collective` null (one rank) they are all there is to read.
Status embed_rank_rows(Collective* collective, const TensorShard& shard, const TensorView& embed, int64_t vocab,
                       int64_t hidden, const int32_t* ids, int64_t n, float* out);

}  // namespace kiln

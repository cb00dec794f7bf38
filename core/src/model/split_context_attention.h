// Decode-context parallelism's meetings over an MLA latent cache split by token (decode_context_shard.h), shared by
// every architecture whose attention reads such a cache (the MLA/MoE family, glm5_next's DSA layers). Each function
// is a meeting of one decode-context group: its ranks call it together, for the same sequence, in the same order.
#pragma once

#include <cstdint>
#include <functional>

#include "kiln/collective.h"
#include "kiln/kv_layout.h"
#include "kiln/status.h"
#include "model/decode_context_shard.h"
#include "model/model_step.h"
#include "model/tensor_shard.h"

namespace kiln {

struct SplitContext {
  Collective* group = nullptr;  // the decode-context group's collective
  DecodeContextShard shard;     // this rank's place in it
  TensorShard heads;            // this rank's tensor-parallel shard: the group is D consecutive ranks of it
};

// Writes this rank's own rows [shard.local_count(len), row] of a sequence's first `len` positions, in local order.
using OwnContextRows = std::function<Status(int64_t local, float* rows)>;

// A per-token cache's rows [ctx, row] of positions [0, ctx) in position order: each rank's own (`own`), gathered.
Status gather_split_rows(const SplitContext& split, int64_t ctx, int64_t row, const OwnContextRows& own, float* rows);

// This rank's own latent (+ rope) rows of a sequence's first `len` positions, decoded through the layout over its
// local table (its pages are an ordinary paged cache of its own tokens).
Status own_latent_rows(const DecodeContextShard& shard, const SequenceStep& st, int64_t len, const void* pages,
                       const KvLayout& layout, float* rows);

// Absorbed attention of a sequence's n query rows qa [n, this rank's heads, latent + rope] → o_lat [n, this rank's
// heads, latent] over every visible position (or, with `selected` [n, selected_width] global positions padded with
// −1, the selected ones): the group's queries are gathered, each rank attends every head of the group over its own
// tokens with each head's log-sum-exp, and the partial outputs are merged in rank order, each rank keeping its
// heads. The merge changes fp32 summation order: agreement with one rank is to rounding, not bit for bit.
Status attend_split_context(const SplitContext& split, int64_t heads, int64_t latent, int64_t rope,
                            const SequenceStep& st, int64_t n, const float* qa, const int32_t* selected,
                            int64_t selected_width, float scale, const void* pages, const KvLayout& layout,
                            float* o_lat);

}  // namespace kiln

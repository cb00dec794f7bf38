// The pooled DSA indexer of GLM-5.3-Flash on the GPU: the semantics of kernels/cpu/pooled_indexer.h
// (specs/glm5-next.md §3), key dim 128, all fp32.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

inline constexpr int64_t kPooledIndexerDim = 128;

// Keys of `count` newly completed pools: pool q's members are rows first_row[q] .. first_row[q] + pool − 1 of
// k / gate (row strides k_stride / gate_stride floats, so an interleaved [k | gate | valid] cache works), its key
// goes to keys row dst_row[q]. ape [pool, 128]; keys [·, 128]. One CTA of 128 threads (one per channel) per pool.
Status pooled_indexer_pool_keys(const float* k, int64_t k_stride, const float* gate, int64_t gate_stride,
                                const float* ape, const int32_t* first_row, const int32_t* dst_row, int64_t count,
                                int64_t pool, float* keys, StreamHandle stream);

// score[s, p] = Σ_h w[s, h] · relu(scale · q[s, h, :] · pool_keys[p, :]) for the candidate pools of query s of one
// sequence at position q_pos0 + s (pools whose last token p · pool + pool − 1 ≤ q_pos), −inf for the others.
// q [t_q, heads, 128], w [t_q, heads], pool_keys [num_pools, 128], scores [t_q, num_pools]; heads ≤ 64.
// With `positions` (device int64 [t_q]), query s is at positions[s] instead (q_pos0 unused): a captured graph then
// follows the step's positions.
Status pooled_indexer_scores(const float* q, const float* w, const float* pool_keys, int64_t t_q, int64_t num_pools,
                             int64_t heads, float scale, int64_t q_pos0, int64_t pool, float* scores,
                             StreamHandle stream, const int64_t* positions = nullptr);

// The selection of cpu::pooled_indexer_select(…, PoolTies::kLowestPool) for each query s (position q_pos0 + s) from the scores above:
// the top min(index_topk / pool, candidates) pools (cuda::topk_rows: descending, ties to the lower pool; the
// non-candidates' −inf rank below every candidate) expanded to their positions in rank order, then with
// select_tail the query's incomplete pool, then −1: out int32 [t_q, width], width ≥ index_topk (+ pool − 1 with
// select_tail) — the same array as the CPU's, element for element. workspace int32 [t_q, index_topk / pool].
// (`positions` as for pooled_indexer_scores.)
Status pooled_indexer_select(const float* scores, int64_t t_q, int64_t num_pools, int64_t q_pos0, int64_t pool,
                             int64_t index_topk, bool select_tail, int32_t* workspace, int32_t* out, int64_t width,
                             StreamHandle stream, const int64_t* positions = nullptr);

}  // namespace kiln::cuda

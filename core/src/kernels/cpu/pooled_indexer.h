// The pooled DSA indexer of GLM-5.3-Flash (glm5_next) on the CPU: keys are scored per pool of `pool` consecutive
// tokens, the top pools are expanded back to their tokens, and the query's own incomplete pool is appended
// (specs/glm5-next.md §3). All fp32. Unlike GLM-5's token-level indexer (dsa_indexer.h) nothing is roped.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// One complete pool's key: key[c] = Σ_j softmax_j(gate[j, c] + ape[j, c]) · k[j, c] (softmax over the pool's
// tokens, per channel). k, gate [pool, dim]: the pool's tokens' indexer keys (after k_norm) and compress-gate
// scores; ape [pool, dim]. key [dim].
void pooled_indexer_pool_key(const float* k, const float* gate, const float* ape, int64_t pool, int64_t dim,
                             float* key);

// score[t, p] = Σ_h w[t, h] · relu(scale · q[t, h, :] · pool_keys[p, :]) over every pool; q [t_q, heads, dim],
// w [t_q, heads] (weights_proj(x) · heads^-½), pool_keys [num_pools, dim], scale = dim^-½; scores [t_q, num_pools].
void pooled_indexer_scores(const float* q, const float* w, const float* pool_keys, int64_t t_q, int64_t num_pools,
                           int64_t heads, int64_t dim, float scale, float* scores);

// The selection of one query at position q_pos (0-based, the sequence's first token at 0) from its scores over
// the complete pools among the cached tokens [0, num_pools): candidates are the pools whose last token is ≤ q_pos;
// the top min(index_topk / pool, num_pools) pools of the row with the other pools at the lowest float — chosen as
// torch.topk does on the CPU (topk.h: exact ties go the same way as in transformers) — and of those the candidates
// each expand to their `pool` positions in order; then, with select_tail, the query's own incomplete pool: positions (q_pos + 1) − tc ..
// q_pos where tc = (q_pos + 1) mod pool. out [width] (width ≥ index_topk, + pool − 1 with select_tail): the
// selected pools' positions, then the tail's, then −1. Attention reads it as a set.
// kLowestPool instead ranks the candidates alone, ties to the lower pool: the CUDA kernel's rule (its tests).
// row_pools ≥ 0: torch's row holds that many pools (those past num_pools masked), as transformers' would over its
// forward's keys (SequenceStep::prompt_length); −1: num_pools.
enum class PoolTies { kTorchCpu, kLowestPool };
void pooled_indexer_select(const float* scores, int64_t num_pools, int64_t q_pos, int64_t pool, int64_t index_topk,
                           bool select_tail, int32_t* out, int64_t width, PoolTies ties = PoolTies::kTorchCpu,
                           int64_t row_pools = -1);

}  // namespace kiln::cpu

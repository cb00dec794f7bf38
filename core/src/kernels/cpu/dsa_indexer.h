// DSA lightning indexer (GLM-5 / DeepSeek-V3.2): which keys each query attends to.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// I[s, t] = Σ_h w[s, h] · ReLU(scale · q[s, h, :]·k[t, :]) for the keys query s may see; −inf elsewhere.
// q [t_q, H, d] and k [t_kv, d] are after RoPE (see rope.h: the GLM indexer ropes the first
// qk_rope_head_dim values, interleaved); w [t_q, H] already includes HF's H^-0.5 factor
// (weights_proj(x) · H^-0.5); scale is HF's softmax_scale = d^-0.5. Query s is at position t_kv − t_q + s
// and sees keys at positions ≤ its own. scores [t_q, t_kv].
void dsa_indexer_scores(const float* q, const float* k, const float* w, int64_t t_q, int64_t t_kv, int64_t num_heads,
                        int64_t head_dim, float scale, float* scores);

// The same scores over an arbitrary set of keys (a decode-context rank's own): key j, row j of k [n_keys, d], is at
// position key_positions[j]; query s is at position first_query_position + s and sees keys at positions ≤ its own.
// Each score is computed exactly as dsa_indexer_scores computes it for that pair. scores [t_q, n_keys].
void dsa_indexer_scores_at(const float* q, const float* k, const int64_t* key_positions, const float* w, int64_t t_q,
                           int64_t first_query_position, int64_t n_keys, int64_t num_heads, int64_t head_dim,
                           float scale, float* scores);

// The same scores over keys stored as fp8 rows (kiln/indexer_key_format.h, kFp8E4m3Scaled): row t of k_rows
// [t_kv, head_dim + 4] is head_dim e4m3 codes, then the key's fp32 scale. Each key is read as it is scored: the
// codes widened to fp32 (exact), the logit (q_h · codes) · key scale · scale, so no fp32 copy of the keys is made.
// The CUDA indexer over fp8 rows computes the same expression.
void dsa_indexer_scores_fp8(const float* q, const uint8_t* k_rows, const float* w, int64_t t_q, int64_t t_kv,
                            int64_t num_heads, int64_t head_dim, float scale, float* scores);
// dsa_indexer_scores_at over fp8 rows.
void dsa_indexer_scores_fp8_at(const float* q, const uint8_t* k_rows, const int64_t* key_positions, const float* w,
                               int64_t t_q, int64_t first_query_position, int64_t n_keys, int64_t num_heads,
                               int64_t head_dim, float scale, float* scores);

// Per query s: the keys transformers keeps — torch.topk(min(index_topk, R)) over the query's row of R keys with the
// keys after it masked, as torch does it on the CPU (torch_cpu_topk_indices, topk.h: ties picked the same way),
// then only the visible ones (positions ≤ t_kv − t_q + s), −1 padded to index_topk. out [t_q, index_topk].
// R = row_lengths[s] (≥ the query's position + 1; keys past t_kv are masked ones), or t_kv without row_lengths:
// transformers' row is as long as its forward's keys (SequenceStep::prompt_length says which that would be).
// Returns the number of rows whose cut fell inside an exact tie (a key left out scores exactly what the last key
// kept scores): there the selection follows torch's CPU procedure, which depends on the row's length, and the CUDA
// runner (lowest positions first) may pick differently. Few indexer heads make such ties common: a key whose
// logits are ≤ 0 for every head scores exactly 0.
int64_t dsa_select_topk(const float* scores, int64_t t_q, int64_t t_kv, int64_t index_topk, int32_t* out,
                        const int64_t* row_lengths = nullptr);

}  // namespace kiln::cpu

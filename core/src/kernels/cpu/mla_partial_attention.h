// Attention split by keys (decode-context parallelism): each part attends over its own keys and returns, beside its
// output, the log-sum-exp of its scores; merging the parts by their LSEs gives the attention over all the keys.
//
//   part d:  m_d = max_t s_t,  Z_d = Σ_t exp(s_t − m_d),  lse_d = m_d + ln Z_d,  out_d = Σ_t exp(s_t − m_d) / Z_d · v_t
//   merged:  lse = ln Σ_d exp(lse_d),  out = Σ_d exp(lse_d − lse) · out_d
//
// A part without keys has lse −inf and a zero output (it weighs nothing); all parts empty merge to zeros. The merge
// visits the parts in index order (rank order), so every rank that merges the same parts gets the same bits. One
// part reproduces mla_attention_absorbed_f32 exactly; several differ from it by fp32 summation order only.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Absorbed attention of one query row (all heads) over the fp32 rows [latent + rope] at `rows + keys[j]·(latent +
// rope)`, j < n_keys: out [H, latent] as mla_attention_absorbed_f32 computes it, and lse [H] (natural log, of the
// scaled scores). `scratch` holds at least H·n_keys + latent + rope floats.
void mla_attention_absorbed_partial(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                    const float* rows, const int64_t* keys, int64_t n_keys, float scale, float* out,
                                    float* lse, float* scratch);

// Merges `parts` partial results of `rows` rows each: out_parts [parts, rows, dim], lse_parts [parts, rows] →
// out [rows, dim] and, when lse is not null, lse [rows]. NaN or +inf LSEs count as −inf (a part that attended to
// nothing usable).
void merge_attention_partials(const float* out_parts, const float* lse_parts, int64_t parts, int64_t rows, int64_t dim,
                              float* out, float* lse);

}  // namespace kiln::cpu

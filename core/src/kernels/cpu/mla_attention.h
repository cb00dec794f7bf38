// MLA attention on the CPU: the expanded form (prefill, and the ground truth for everything else) and the
// pieces of the absorbed form used in decode (see specs/models.md, "MLA").
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Expanded causal attention. q [t_q, H, qk_dim], k [t_kv, H, qk_dim], v [t_kv, H, v_dim], out [t_q, H, v_dim].
// Query i is at position t_kv − t_q + i (the queries are the last t_q of the t_kv tokens) and sees keys at
// positions ≤ its own. With `selected` ([t_q, selected_width] key positions, −1 padded; DSA top-k) only the
// selected keys among those are visible. A query with no visible key gets a zero output.
void mla_attention_expanded(const float* q, const float* k, const float* v, int64_t t_q, int64_t t_kv,
                            int64_t num_heads, int64_t qk_dim, int64_t v_dim, float scale, const int32_t* selected,
                            int64_t selected_width, float* out);

// kv_b_proj.weight [H·(nope + v_dim), latent] viewed as W[h] = [nope + v_dim, latent]: rows 0..nope-1 are
// W_UK_h, rows nope.. are W_UV_h.
struct MlaAbsorbDims {
  int64_t num_heads = 0;
  int64_t nope_dim = 0;    // qk_nope_head_dim
  int64_t v_dim = 0;       // v_head_dim
  int64_t latent_dim = 0;  // kv_lora_rank
};

// q_lat[t, h, :] = q_nope[t, h, :] · W_UK_h  (latent_dim values). q_nope row (t, h) starts at
// q_nope + (t·H + h)·in_head_stride; q_lat row (t, h) at q_lat + (t·H + h)·out_head_stride, so the result
// can be written straight into a [n, H, latent + rope] absorbed query.
void mla_absorb_query(const float* q_nope, int64_t n, int64_t in_head_stride, const float* kv_b_weight,
                      const MlaAbsorbDims& dims, float* q_lat, int64_t out_head_stride);

// o[t, h, :] = W_UV_h · o_lat[t, h, :]; o_lat [n, H, latent_dim], o [n, H, v_dim].
void mla_unabsorb_output(const float* o_lat, int64_t n, const float* kv_b_weight, const MlaAbsorbDims& dims,
                         float* o);

// Absorbed attention of one query row (all heads) over cached tokens stored as bf16 rows [latent + rope]
// (latent first): score_h,t = scale·(q[h, :latent]·c_t + q[h, latent:]·k_pe_t), softmax over the n_keys
// rows at `cache + slots[j]·(latent + rope)`, out[h, :] = Σ p·c_t. q [H, latent + rope], out [H, latent].
// `scratch` holds at least H·n_keys + latent + rope floats. n_keys = 0 gives zeros.
void mla_attention_absorbed_bf16(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                 const uint16_t* cache, const int64_t* slots, int64_t n_keys, float scale, float* out,
                                 float* scratch);
// The same over fp32 rows (the exact reference layout).
void mla_attention_absorbed_f32(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                const float* cache, const int64_t* slots, int64_t n_keys, float scale, float* out,
                                float* scratch);

}  // namespace kiln::cpu

// KDA (Kimi delta attention), the linear-attention layer of GLM-5.3-Flash (glm5_next), on the CPU: the reference
// the CUDA kernels are tested against (specs/glm5-next.md §2). All fp32; heads H, key dim dk, value dim dv.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Causal depthwise conv of `width` taps over t new tokens that continue from `state`, then SiLU.
// in [t, channels] (the pre-conv q|k|v), weight [channels, width] (weight[c, width − 1] multiplies the current
// token), state [width − 1, channels]: the last width − 1 pre-conv inputs before these tokens, oldest first (zeros
// for a new sequence); updated in place to the last width − 1 inputs after them. out [t, channels] may not alias in.
void kda_short_conv_silu(const float* in, int64_t t, int64_t channels, const float* weight, int64_t width,
                         float* state, float* out);

// The per-channel log decay, in place. g [t, heads, dk] holds f_b(f_a(x)) + dt_bias; a_log [heads].
// With a lower bound lb (GLM-5.3-Flash: −5): g = lb · σ(exp(a_log[h]) · g) ∈ (lb, 0).
// Without (legacy checkpoints): g = −exp(a_log[h]) · softplus(g) (softplus(x) = x above 20).
void kda_forget_gate(float* g, int64_t t, int64_t heads, int64_t dk, const float* a_log, bool has_lower_bound,
                     float lower_bound);

// q, k [t, heads, dk] are L2-normalised per head (x / sqrt(Σx² + 1e-6)) and q scaled by dk^-½ — in place, once,
// before either form of the kernel below (they take normalised inputs).
void kda_normalize_qk(float* q, float* k, int64_t t, int64_t heads, int64_t dk);

// The recurrence, token by token (decode, and the reference of the chunked form). Per head, state S [dk, dv]:
//   S ← diag(exp g_t) S;  u = β_t (v_t − Sᵀ k_t);  S ← S + k_t uᵀ;  o_t = Sᵀ q_t.
// q, k [t, heads, dk] normalised; v [t, heads, dv]; g [t, heads, dk]; beta [t, heads]; state [heads, dk, dv]
// in/out; out [t, heads, dv].
void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t t,
                   int64_t heads, int64_t dk, int64_t dv, float* state, float* out);

// The chunked (WY) form of the same recurrence with chunks of `chunk` tokens (transformers and FLA: 64), the tail
// padded with g = 0, β = 0. Equal to kda_recurrent up to fp32 rounding. Same arguments.
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t t,
                 int64_t heads, int64_t dk, int64_t dv, int64_t chunk, float* state, float* out);

// RMSNormGated over each head's dv values: y = w ⊙ o · rsqrt(mean(o²) + eps) ⊙ σ(gate).
// o, gate, y [t, heads, dv] (y may alias o); weight [dv] shared by all heads.
void kda_gated_rmsnorm(const float* o, const float* gate, const float* weight, int64_t t, int64_t heads, int64_t dv,
                       float eps, float* y);

}  // namespace kiln::cpu

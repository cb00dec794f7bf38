// KDA (Kimi delta attention) of GLM-5.3-Flash on the GPU: the semantics of kernels/cpu/kda.h
// (specs/glm5-next.md §2), head dims dk = dv = 128, any head count.
//
// State slot (one per sequence and KDA layer, CacheManager's [state slots, slot_bytes] entry): the recurrent state
// fp32 [heads, 128 (dk), 128 (dv)] at byte 0, then the conv state fp32 [conv width − 1 = 3, 3 · heads · 128]
// (the last three pre-conv q | k | v inputs, oldest first; zeros for a new sequence). kda_state_slot_bytes gives
// the least slot_bytes; a slot's base must be 16-byte aligned.
//
// Inputs fuse what the CPU reference takes as separate steps: the forget gate is applied to the raw
// f_b_proj(f_a_proj(x)) values (+ dt_bias), β = σ(b_proj(x)) from its logits, and q, k are L2-normalised (q also
// scaled by 128^-½) inside the kernels, in fp32, as cpu::kda_forget_gate / kda_normalize_qk do.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

inline constexpr int64_t kKdaHeadDim = 128;
inline constexpr int64_t kKdaConvWidth = 4;

inline int64_t kda_state_slot_bytes(int64_t heads) {
  return heads * kKdaHeadDim * kKdaHeadDim * 4 + (kKdaConvWidth - 1) * 3 * heads * kKdaHeadDim * 4;
}

// Where each sequence's state lives: slot slot_ids[s] at state + slot_ids[s] · slot_bytes.
struct KdaStateSlots {
  char* state = nullptr;
  int64_t slot_bytes = 0;
  const int32_t* slot_ids = nullptr;  // device [num_seqs]
};

// The forget gate's parameters: g = lower_bound · σ(exp(a_log[h]) · (g0 + dt_bias)) with a lower bound,
// g = −exp(a_log[h]) · softplus(g0 + dt_bias) without (legacy checkpoints).
struct KdaGate {
  const float* a_log = nullptr;    // [heads]
  const float* dt_bias = nullptr;  // [heads · 128], or null for none
  bool has_lower_bound = true;
  float lower_bound = -5.f;
};

// Decode and speculative verification: `tokens` new tokens per sequence (1, or 1 + K), one launch per layer,
// grid (heads, num_seqs), 512 threads; the head's 64 KiB state is read once into registers, every token's
// conv + SiLU (rounded to bf16 as the reference model does), normalisation, gate and delta-rule step runs on it,
// and it is written back once; the conv state is updated too. With `gate`, the output is RMSNormGated
// (w ⊙ o · rsqrt(mean(o²) + norm_eps) ⊙ σ(gate)), else the raw o.
struct KdaDecodeParams {
  const uint16_t* qkv = nullptr;          // bf16 [num_seqs, tokens, 3 · heads · 128]: pre-conv q | k | v
  const float* conv_weight = nullptr;     // [3 · heads · 128, 4]; tap 3 multiplies the current token
  const float* g = nullptr;               // [num_seqs, tokens, heads · 128]: f_b_proj output, before the gate
  const float* beta_logits = nullptr;     // [num_seqs, tokens, heads]
  const float* gate = nullptr;            // [num_seqs, tokens, heads · 128] or null (no RMSNormGated)
  const float* norm_weight = nullptr;     // [128], with gate
  float norm_eps = 1e-5f;
  KdaGate forget;
  KdaStateSlots slots;
  int64_t num_seqs = 0;
  int64_t tokens = 1;
  int64_t heads = 0;
  float* out = nullptr;                   // fp32 [num_seqs, tokens, heads · 128], or null
  uint16_t* out_bf16 = nullptr;           // bf16, same shape, or null (at least one of the two)
};
Status kda_decode(const KdaDecodeParams& p, StreamHandle stream);

// Prefill / continuation: the short conv over [stored 3 | new] pre-conv inputs for a batch of sequences
// (concatenated, sequence s's tokens at cu_seqlens[s] .. cu_seqlens[s + 1]), SiLU, rounded to bf16; the conv
// state of each slot is then advanced to its last 3 inputs. Two launches (outputs, then state).
Status kda_conv_prefill(const uint16_t* qkv, const float* conv_weight, const int32_t* cu_seqlens, int64_t num_seqs,
                        int64_t total_tokens, int64_t heads, const KdaStateSlots& slots, uint16_t* out,
                        StreamHandle stream);

// The chunked (WY, C = 64) form on the tensor cores (3xTF32 mma.sync, fp32 accumulation and state) over
// convolved bf16 q, k, v [total_tokens, heads, 128] (as kda_conv_prefill writes them: q | k | v per token, row
// stride 3 · heads · 128), continuing from and writing back each slot's recurrent state. Grid (heads, 2 halves
// of dv, num_seqs), 512 threads, ~198 KiB shared memory; each CTA walks its sequence's chunks in order.
// The 16-token sub-chunk exponent trick needs |lower_bound| ≤ 5.5; without a lower bound (or outside that)
// the same call falls back to the exact recurrent kernel token by token (kda_decode's core, fp32 SIMT).
// out: raw o, fp32 [total_tokens, heads, 128] (RMSNormGated is kda_gated_rmsnorm).
struct KdaPrefillParams {
  const uint16_t* qkv = nullptr;        // bf16 [total_tokens, 3 · heads · 128], post-conv q | k | v
  const float* g = nullptr;             // [total_tokens, heads · 128]: f_b_proj output, before the gate
  const float* beta_logits = nullptr;   // [total_tokens, heads]
  KdaGate forget;
  KdaStateSlots slots;
  const int32_t* cu_seqlens = nullptr;  // device [num_seqs + 1]
  int64_t num_seqs = 0;
  int64_t total_tokens = 0;
  int64_t heads = 0;
  float* out = nullptr;                 // fp32 [total_tokens, heads, 128]
  // Each tf32 product split in three (3xTF32), accurate to fp32 rounding, so prompt chunks agree with the fp32
  // recurrence (decode, the CPU reference); false: one tf32 product each (2^-11 operands), for comparison only.
  bool split_tf32 = true;
};
Status kda_prefill(const KdaPrefillParams& p, StreamHandle stream);
// Whether kda_prefill takes the tensor-core path for this gate (else the recurrent fallback).
bool kda_prefill_uses_chunked(const KdaGate& gate);

// RMSNormGated over each head's 128 values: y = w ⊙ o · rsqrt(mean(o²) + eps) ⊙ σ(gate). o, gate fp32
// [n, heads, 128]; weight [128]; y fp32 and/or bf16 (either may be null). One warp per (token, head).
Status kda_gated_rmsnorm(const float* o, const float* gate, const float* weight, int64_t n, int64_t heads, float eps,
                         float* y, uint16_t* y_bf16, StreamHandle stream);

}  // namespace kiln::cuda

// DSA lightning-indexer scores on the GPU (semantics of cpu::dsa_indexer_scores; top-k via cuda::topk_rows
// with causal_offset = t_kv − t_q).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// scores[s, t] = Σ_h w[s, h] · ReLU(scale · q[s, h, :]·k[t, :]) for t ≤ t_kv − t_q + s, −inf after.
// q bf16 [t_q, num_heads, 128] (after RoPE), k bf16 [t_kv, 128] (the indexer key cache), w fp32 [t_q, num_heads]
// (HF's weights_proj(x)·H^-0.5), scores fp32 [t_q, t_kv]. num_heads ∈ {32, 64}.
Status dsa_indexer_scores_bf16(const uint16_t* q, const uint16_t* k, const float* w, int64_t t_q, int64_t t_kv,
                               int64_t num_heads, float scale, float* scores, StreamHandle stream);

}  // namespace kiln::cuda

// The MoE gate's logits for few tokens (decode, speculative verification): logits[t, e] = x[t, :] · W[e, :] in
// fp32 with x read as bf16 (the cast fused in), as the CPU model runs the gate. Batch invariant: each logit's
// summation order depends on `hidden` only, never on n, so a token's logits are bitwise the same whatever other
// tokens share the call (cuBLAS's sgemm picks its algorithm, hence its order, by n).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// x bf16 [n, hidden], w fp32 [experts, hidden] (the router), logits fp32 [n, experts]. hidden % 4 == 0, x 8-byte
// and w 16-byte aligned, 1 ≤ experts ≤ 65535. Any n, but it re-reads W per 8 tokens: meant for n ≤ 32.
Status moe_gate_logits_bf16(const uint16_t* x, int64_t n, int64_t hidden, const float* w, int64_t experts,
                            float* logits, StreamHandle stream);

}  // namespace kiln::cuda

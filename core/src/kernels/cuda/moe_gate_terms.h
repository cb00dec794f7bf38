// The MoE gate's logits for many tokens (prefill) on the tensor cores: the fp32 router held as the exact sum of up
// to three bf16 matrices (cpu::bf16_terms), so x · Wᵀ = Σ_t x · W_tᵀ where every product of a bf16 input and a bf16
// term is exact in fp32 and the sums run in fp32 — what an fp32 GEMM of the widened input computes, in another
// summation order, without widening the input (a 4K GLM-4.7-Flash layer: the widening and the fp32 GEMM took 55 µs).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// x bf16 [n, hidden]; terms bf16 [n_terms · experts, hidden] (term-major, n_terms 1..3); logits fp32 [n, experts].
// With n_terms > 1 the terms' logits go to `scratch` (scratch_floats fp32, at least n · n_terms · experts) first and
// are summed smallest term first. Where the GEMM's output tiles fill less than half the SMs (a 4K chunk's gate: 64
// tiles on 132 SMs) and scratch holds it, the hidden dimension is split in 2 or 4 (one strided-batched GEMM) and
// the sum kernel adds the splits in order, then the terms: another fp32 summation order of the same exact products.
// KILN_MOE_GATE_SPLITK=1|2|4 fixes the split (A/B; a split that does not fit is not taken). `blas` on `stream`'s
// device (bound to `stream` here).
Status moe_gate_logits_bf16_terms(cublasHandle_t blas, const uint16_t* x, int64_t n, int64_t hidden, const uint16_t* terms,
                                  int n_terms, int64_t experts, float* scratch, int64_t scratch_floats, float* logits,
                                  StreamHandle stream);

// The split of the hidden dimension the call above takes for a shape (1, 2 or 4) on a device of `sms` SMs.
int moe_gate_terms_splits(int64_t n, int64_t hidden, int n_terms, int64_t experts, int64_t scratch_floats, int sms);

}  // namespace kiln::cuda

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
// With n_terms > 1 the terms' logits go to `scratch` fp32 [n, n_terms · experts] first and are summed smallest term
// first. `blas` on `stream`'s device (bound to `stream` here).
Status moe_gate_logits_bf16_terms(cublasHandle_t blas, const uint16_t* x, int64_t n, int64_t hidden, const uint16_t* terms,
                                  int n_terms, int64_t experts, float* scratch, float* logits, StreamHandle stream);

}  // namespace kiln::cuda

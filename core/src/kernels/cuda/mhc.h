// mHC (manifold-constrained hyper-connections) of GLM-5.3-Flash on the GPU: the semantics of kernels/cpu/mhc.h
// (specs/glm5-next.md §1) for 4 streams. The streams are stored fp32 [n, 4, dim] (the CPU reference's type; the
// transformers model keeps them bf16), so the residual stream is never rounded.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

inline constexpr int64_t kMhcStreams = 4;

struct MhcDeviceParams {
  const float* fn = nullptr;     // [24, 4 · dim]
  const float* base = nullptr;   // [24]
  const float* scale = nullptr;  // [3]
  int64_t dim = 0;               // multiple of 4
  float rms_eps = 1e-5f;
  float hc_eps = 1e-6f;
  int64_t sinkhorn_iters = 20;
};

// Maps and collapse in one kernel: for each token, the RMS of its flattened 4 · dim streams, the 24 projections
// r = f · fnᵀ, pre / post / comb (softmax + Sinkhorn), and h = Σ_i pre[i] · x[i]. x fp32 [n, 4, dim];
// pre, post [n, 4], comb [n, 4 (i), 4 (j)] fp32; h fp32 and/or bf16 [n, dim] (either may be null).
// Per token a cluster of 8 CTAs of 256 threads, each a slice of the projections and of the collapse (from 512
// tokens on: 4 tokens per cluster of 2 CTAs, so fn is read once per 4 tokens).
Status mhc_maps_collapse(const float* x, int64_t n, const MhcDeviceParams& p, float* pre, float* post, float* comb,
                         float* h, uint16_t* h_bf16, StreamHandle stream);

// The residual update in place: x[t, j] ← post[t, j] · y[t] + Σ_i comb[t, i, j] · x[t, i]. y bf16 or fp32 [n, dim].
Status mhc_mix(float* x, const uint16_t* y_bf16, const float* post, const float* comb, int64_t n, int64_t dim,
               StreamHandle stream);
Status mhc_mix(float* x, const float* y, const float* post, const float* comb, int64_t n, int64_t dim,
               StreamHandle stream);

}  // namespace kiln::cuda

// mHC (manifold-constrained hyper-connections) of GLM-5.3-Flash on the CPU: the residual stream is `streams`
// parallel copies of the hidden state; each sub-layer reads a weighted collapse of them and writes its output back
// through a doubly-stochastic mixer (specs/glm5-next.md §1). All fp32.
#pragma once

#include <cstdint>

namespace kiln::cpu {

struct MhcParams {
  const float* fn = nullptr;     // [(2 + streams) · streams, streams · dim]
  const float* base = nullptr;   // [(2 + streams) · streams]
  const float* scale = nullptr;  // [3]: pre, post, comb
  int64_t streams = 4;           // hc_mult
  int64_t dim = 0;               // hidden size
  float rms_eps = 1e-5f;         // rms_norm_eps: the unweighted RMSNorm of the flattened streams
  float hc_eps = 1e-6f;
  int64_t sinkhorn_iters = 20;   // hc_sinkhorn_iters (the first column normalisation counts as one)
};

// The maps of n tokens from their streams x [n, streams, dim]:
//   f = x flattened · rsqrt(mean(x²) + rms_eps);  r = f · fnᵀ split into pre | post | comb logits;
//   pre[i] = σ(r_i · scale[0] + base[i]) + hc_eps;  post[j] = 2σ(r_{s+j} · scale[1] + base[s+j]);
//   comb = softmax over j of (r_{2s+s·i+j} · scale[2] + base[2s+s·i+j]) + hc_eps, normalised over i once, then
//   (sinkhorn_iters − 1)× over j then over i (each divides by the sum + hc_eps).
// pre [n, streams], post [n, streams], comb [n, streams (i), streams (j)].
void mhc_maps(const float* x, int64_t n, const MhcParams& p, float* pre, float* post, float* comb);

// The sub-layer input: h[t] = Σ_i pre[t, i] · x[t, i]. h [n, dim].
void mhc_collapse(const float* x, const float* pre, int64_t n, int64_t streams, int64_t dim, float* h);

// The residual update, in place: x[t, j] ← post[t, j] · y[t] + Σ_i comb[t, i, j] · x[t, i]. y [n, dim].
void mhc_mix(float* x, const float* y, const float* post, const float* comb, int64_t n, int64_t streams, int64_t dim);

}  // namespace kiln::cpu

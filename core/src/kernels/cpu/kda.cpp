#include "kernels/cpu/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::cpu {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void kda_short_conv_silu(const float* in, int64_t t, int64_t channels, const float* weight, int64_t width,
                         float* state, float* out) {
  const int64_t hist = width - 1;
#pragma omp parallel for schedule(static) if (t * channels * width >= (1 << 16))
  for (int64_t c = 0; c < channels; ++c) {
    // The channel's inputs in time order: the stored history, then the new tokens.
    auto input = [&](int64_t ext) { return ext < hist ? state[ext * channels + c] : in[(ext - hist) * channels + c]; };
    const float* w = weight + c * width;
    for (int64_t tau = 0; tau < t; ++tau) {
      float acc = 0.f;
      for (int64_t j = 0; j < width; ++j) acc += w[j] * input(tau + j);
      out[tau * channels + c] = acc * sigmoid(acc);
    }
    // The last `hist` inputs become the new history (read before any is overwritten: ascending order is safe since
    // entry r takes ext index t + r ≥ r).
    for (int64_t r = 0; r < hist; ++r) state[r * channels + c] = input(t + r);
  }
}

void kda_forget_gate(float* g, int64_t t, int64_t heads, int64_t dk, const float* a_log, bool has_lower_bound,
                     float lower_bound) {
  for (int64_t tau = 0; tau < t; ++tau)
    for (int64_t h = 0; h < heads; ++h) {
      const float a = std::exp(a_log[h]);
      float* row = g + (tau * heads + h) * dk;
      for (int64_t i = 0; i < dk; ++i) {
        const float x = row[i];
        if (has_lower_bound) {
          row[i] = lower_bound * sigmoid(a * x);
        } else {
          const float softplus = x > 20.0f ? x : std::log(1.0f + std::exp(x));
          row[i] = -a * softplus;
        }
      }
    }
}

void kda_normalize_qk(float* q, float* k, int64_t t, int64_t heads, int64_t dk) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  auto l2 = [dk](float* x, float extra) {
    float ss = 0.f;
    for (int64_t i = 0; i < dk; ++i) ss += x[i] * x[i];
    const float norm = std::sqrt(ss + 1e-6f);
    for (int64_t i = 0; i < dk; ++i) x[i] = x[i] / norm * extra;
  };
  for (int64_t r = 0; r < t * heads; ++r) {
    l2(q + r * dk, scale);
    l2(k + r * dk, 1.0f);
  }
}

void kda_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t t,
                   int64_t heads, int64_t dk, int64_t dv, float* state, float* out) {
#pragma omp parallel for schedule(static) if (heads * t * dk * dv >= (1 << 16))
  for (int64_t h = 0; h < heads; ++h) {
    float* S = state + h * dk * dv;
    std::vector<float> u(dv);
    for (int64_t tau = 0; tau < t; ++tau) {
      const int64_t row = tau * heads + h;
      const float* qt = q + row * dk;
      const float* kt = k + row * dk;
      const float* vt = v + row * dv;
      const float* gt = g + row * dk;
      const float b = beta[row];
      // S ← diag(e^g) S, and p = Sᵀk over the decayed state in the same pass.
      std::fill(u.begin(), u.end(), 0.f);
      for (int64_t i = 0; i < dk; ++i) {
        const float decay = std::exp(gt[i]);
        float* Si = S + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          Si[j] *= decay;
          u[j] += Si[j] * kt[i];
        }
      }
      for (int64_t j = 0; j < dv; ++j) u[j] = b * (vt[j] - u[j]);
      float* o = out + row * dv;
      std::fill(o, o + dv, 0.f);
      for (int64_t i = 0; i < dk; ++i) {
        float* Si = S + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          Si[j] += kt[i] * u[j];
          o[j] += Si[j] * qt[i];
        }
      }
    }
  }
}

void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t t,
                 int64_t heads, int64_t dk, int64_t dv, int64_t chunk, float* state, float* out) {
  const int64_t C = chunk;
#pragma omp parallel for schedule(static) if (heads * t * dk * dv >= (1 << 16))
  for (int64_t h = 0; h < heads; ++h) {
    float* S = state + h * dk * dv;
    // One chunk's rows for this head; the padded tail keeps zeros (g = 0, β = 0: no decay, no update).
    std::vector<float> Q(C * dk), K(C * dk), V(C * dv), G(C * dk), B(C), L(C * C), T(C * C), U(C * dv), W(C * dk),
        Vp(C * dv), A(C * C), O(C * dv);
    for (int64_t c0 = 0; c0 < t; c0 += C) {
      const int64_t n = std::min(C, t - c0);
      std::fill(Q.begin(), Q.end(), 0.f), std::fill(K.begin(), K.end(), 0.f), std::fill(V.begin(), V.end(), 0.f);
      std::fill(G.begin(), G.end(), 0.f), std::fill(B.begin(), B.end(), 0.f);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = (c0 + r) * heads + h;
        std::copy_n(q + row * dk, dk, Q.data() + r * dk);
        std::copy_n(k + row * dk, dk, K.data() + r * dk);
        std::copy_n(v + row * dv, dv, V.data() + r * dv);
        std::copy_n(g + row * dk, dk, G.data() + r * dk);
        B[r] = beta[row];
      }
      // G: the inclusive cumulative log decay of each channel inside the chunk.
      for (int64_t r = 1; r < C; ++r)
        for (int64_t i = 0; i < dk; ++i) G[r * dk + i] += G[(r - 1) * dk + i];
      // L[r, c] = β_r Σ_i k_r[i] k_c[i] e^{G_r[i] − G_c[i]} (c < r); A[r, c] = Σ_i q_r[i] k_c[i] e^{G_r[i] − G_c[i]}
      // (c ≤ r). Differences only: e^{G_r} · e^{−G_c} alone would overflow fp32 across a chunk.
      std::fill(L.begin(), L.end(), 0.f), std::fill(A.begin(), A.end(), 0.f);
      for (int64_t r = 0; r < C; ++r)
        for (int64_t c = 0; c <= r; ++c) {
          float lk = 0.f, aq = 0.f;
          for (int64_t i = 0; i < dk; ++i) {
            const float e = std::exp(G[r * dk + i] - G[c * dk + i]);
            lk += K[r * dk + i] * K[c * dk + i] * e;
            aq += Q[r * dk + i] * K[c * dk + i] * e;
          }
          if (c < r) L[r * C + c] = B[r] * lk;
          A[r * C + c] = aq;
        }
      // T = (I + L)⁻¹ by forward substitution (unit lower triangular).
      std::fill(T.begin(), T.end(), 0.f);
      for (int64_t r = 0; r < C; ++r) {
        T[r * C + r] = 1.f;
        for (int64_t c = 0; c < r; ++c) {
          float s = 0.f;
          for (int64_t m = c; m < r; ++m) s += L[r * C + m] * T[m * C + c];
          T[r * C + c] = -s;
        }
      }
      // U = T (β ⊙ V), W = T (β ⊙ K ⊙ e^G).
      for (int64_t r = 0; r < C; ++r) {
        for (int64_t j = 0; j < dv; ++j) {
          float s = 0.f;
          for (int64_t m = 0; m <= r; ++m) s += T[r * C + m] * B[m] * V[m * dv + j];
          U[r * dv + j] = s;
        }
        for (int64_t i = 0; i < dk; ++i) {
          float s = 0.f;
          for (int64_t m = 0; m <= r; ++m) s += T[r * C + m] * B[m] * K[m * dk + i] * std::exp(G[m * dk + i]);
          W[r * dk + i] = s;
        }
      }
      // V′ = U − W S; O = (Q ⊙ e^G) S + A V′.
      for (int64_t r = 0; r < C; ++r)
        for (int64_t j = 0; j < dv; ++j) {
          float ws = 0.f, qs = 0.f;
          for (int64_t i = 0; i < dk; ++i) {
            ws += W[r * dk + i] * S[i * dv + j];
            qs += Q[r * dk + i] * std::exp(G[r * dk + i]) * S[i * dv + j];
          }
          Vp[r * dv + j] = U[r * dv + j] - ws;
          O[r * dv + j] = qs;
        }
      for (int64_t r = 0; r < n; ++r) {
        float* o = out + ((c0 + r) * heads + h) * dv;
        for (int64_t j = 0; j < dv; ++j) {
          float s = O[r * dv + j];
          for (int64_t c = 0; c <= r; ++c) s += A[r * C + c] * Vp[c * dv + j];
          o[j] = s;
        }
      }
      // S ← diag(e^{G_last}) S + (K ⊙ e^{G_last − G})ᵀ V′.
      const float* Gl = G.data() + (C - 1) * dk;
      for (int64_t i = 0; i < dk; ++i) {
        const float decay = std::exp(Gl[i]);
        for (int64_t j = 0; j < dv; ++j) {
          float s = 0.f;
          for (int64_t r = 0; r < C; ++r) s += K[r * dk + i] * std::exp(Gl[i] - G[r * dk + i]) * Vp[r * dv + j];
          S[i * dv + j] = S[i * dv + j] * decay + s;
        }
      }
    }
  }
}

void kda_gated_rmsnorm(const float* o, const float* gate, const float* weight, int64_t t, int64_t heads, int64_t dv,
                       float eps, float* y) {
  for (int64_t r = 0; r < t * heads; ++r) {
    const float* x = o + r * dv;
    float ss = 0.f;
    for (int64_t j = 0; j < dv; ++j) ss += x[j] * x[j];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dv) + eps);
    for (int64_t j = 0; j < dv; ++j) y[r * dv + j] = weight[j] * (x[j] * inv) * sigmoid(gate[r * dv + j]);
  }
}

}  // namespace kiln::cpu

// The fp32 host arithmetic of the vision tower: linears, norms, the clamped SwiGLU and non-causal attention over
// one segment. Rows are independent, so they run on the OpenMP team the core sizes (`model.threads`); each row's
// sums run in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace kiln::vision {

// y[r, o] = Σ_i x[r, i]·w[o, i] + b[o]  (w [out, in] row-major; b may be null).
void linear(const float* x, int64_t rows, int64_t in, const float* w, const float* b, int64_t out, float* y);

// In place, per row of `width`: x ← x·rsqrt(mean(x²) + eps)·w.
void rms_norm(float* x, int64_t rows, int64_t width, const float* w, double eps);

// In place, per row: x ← (x − mean)·rsqrt(var + eps)·w + b (biased variance, as torch's LayerNorm).
void layer_norm(float* x, int64_t rows, int64_t width, const float* w, const float* b, double eps);

// In place on gate [rows, width]: silu(min(gate, limit))·clamp(up, −limit, limit).
void clamped_swiglu(float* gate, const float* up, int64_t count, double limit);

// In place: exact (erf) GELU.
void gelu(float* x, int64_t count);

// Non-causal softmax(q·kᵀ·scale)·v for one segment of `len` rows and one head; q, k, v, out rows have `stride`
// floats between them and `dim` used.
void attend_segment(const float* q, const float* k, const float* v, float* out, int64_t len, int64_t dim,
                    int64_t stride, float scale);

}  // namespace kiln::vision

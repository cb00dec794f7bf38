// Element-wise activations and the row softmax, fp32.
#pragma once

#include <cstdint>
#include <limits>

namespace kiln::cpu {

void sigmoid(const float* x, int64_t count, float* out);
void silu(const float* x, int64_t count, float* out);

// out[t, i] = silu(min(gate[t, i], limit)) · clamp(up[t, i], −limit, limit) for n rows of `inter` values.
// Row t of gate / up starts at t · in_stride, so one call serves both a fused [n, 2·inter] gate|up buffer
// (up = gate + inter, in_stride = 2·inter) and two separate [n, inter] buffers (in_stride = inter).
// limit = +inf is plain SwiGLU; glm5_next clamps with its swiglu_limit.
void swiglu(const float* gate, const float* up, int64_t n, int64_t inter, int64_t in_stride, float* out,
            float limit = std::numeric_limits<float>::infinity());

// Numerically stable softmax over each of n rows of `dim` values (subtracts the row max; fp64 sum).
// A row that is entirely −inf becomes all zeros.
void softmax(const float* x, int64_t n, int64_t dim, float* out);

}  // namespace kiln::cpu

#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelElements = 1 << 15;

inline float sigmoid_scalar(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void sigmoid(const float* x, int64_t count, float* out) {
#pragma omp parallel for schedule(static) if (count >= kParallelElements)
  for (int64_t i = 0; i < count; ++i) out[i] = sigmoid_scalar(x[i]);
}

void silu(const float* x, int64_t count, float* out) {
#pragma omp parallel for schedule(static) if (count >= kParallelElements)
  for (int64_t i = 0; i < count; ++i) out[i] = x[i] * sigmoid_scalar(x[i]);
}

void swiglu(const float* gate, const float* up, int64_t n, int64_t inter, int64_t in_stride, float* out, float limit) {
#pragma omp parallel for schedule(static) if (n * inter >= kParallelElements)
  for (int64_t t = 0; t < n; ++t) {
    const float* g = gate + t * in_stride;
    const float* u = up + t * in_stride;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float gi = std::min(g[i], limit);
      const float ui = std::clamp(u[i], -limit, limit);
      o[i] = gi * sigmoid_scalar(gi) * ui;
    }
  }
}

void softmax(const float* x, int64_t n, int64_t dim, float* out) {
#pragma omp parallel for schedule(static) if (n * dim >= kParallelElements)
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    float* ot = out + t * dim;
    float max_v = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < dim; ++i) max_v = std::max(max_v, xt[i]);
    if (max_v == -std::numeric_limits<float>::infinity()) {
      std::fill(ot, ot + dim, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      ot[i] = std::exp(xt[i] - max_v);
      sum += ot[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i) ot[i] *= inv;
  }
}

}  // namespace kiln::cpu

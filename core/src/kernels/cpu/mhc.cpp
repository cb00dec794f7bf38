#include "kernels/cpu/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::cpu {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void mhc_maps(const float* x, int64_t n, const MhcParams& p, float* pre, float* post, float* comb) {
  const int64_t s = p.streams, width = s * p.dim, maps = (2 + s) * s;
#pragma omp parallel for schedule(static) if (n * maps * width >= (1 << 18))
  for (int64_t t = 0; t < n; ++t) {
    const float* f = x + t * width;
    float ss = 0.f;
    for (int64_t i = 0; i < width; ++i) ss += f[i] * f[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(width) + p.rms_eps);
    std::vector<float> normed(width), r(maps);
    for (int64_t i = 0; i < width; ++i) normed[i] = f[i] * inv;
    for (int64_t m = 0; m < maps; ++m) {
      const float* w = p.fn + m * width;
      float acc = 0.f;
      for (int64_t i = 0; i < width; ++i) acc += normed[i] * w[i];
      r[m] = acc;
    }
    float* pr = pre + t * s;
    float* po = post + t * s;
    float* cm = comb + t * s * s;
    for (int64_t i = 0; i < s; ++i) {
      pr[i] = sigmoid(r[i] * p.scale[0] + p.base[i]) + p.hc_eps;
      po[i] = 2.0f * sigmoid(r[s + i] * p.scale[1] + p.base[s + i]);
    }
    // comb[i][j]: softmax over j of each row, then Sinkhorn towards doubly stochastic, columns first.
    for (int64_t i = 0; i < s; ++i) {
      float* row = cm + i * s;
      float mx = -INFINITY;
      for (int64_t j = 0; j < s; ++j) {
        row[j] = r[2 * s + i * s + j] * p.scale[2] + p.base[2 * s + i * s + j];
        mx = std::max(mx, row[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < s; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (int64_t j = 0; j < s; ++j) row[j] = row[j] / sum + p.hc_eps;
    }
    auto normalize_columns = [&] {
      for (int64_t j = 0; j < s; ++j) {
        float sum = 0.f;
        for (int64_t i = 0; i < s; ++i) sum += cm[i * s + j];
        for (int64_t i = 0; i < s; ++i) cm[i * s + j] /= sum + p.hc_eps;
      }
    };
    normalize_columns();
    for (int64_t it = 1; it < p.sinkhorn_iters; ++it) {
      for (int64_t i = 0; i < s; ++i) {
        float sum = 0.f;
        for (int64_t j = 0; j < s; ++j) sum += cm[i * s + j];
        for (int64_t j = 0; j < s; ++j) cm[i * s + j] /= sum + p.hc_eps;
      }
      normalize_columns();
    }
  }
}

void mhc_collapse(const float* x, const float* pre, int64_t n, int64_t streams, int64_t dim, float* h) {
#pragma omp parallel for schedule(static) if (n * streams * dim >= (1 << 16))
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0.f;
      for (int64_t i = 0; i < streams; ++i) acc += pre[t * streams + i] * x[(t * streams + i) * dim + d];
      h[t * dim + d] = acc;
    }
}

void mhc_mix(float* x, const float* y, const float* post, const float* comb, int64_t n, int64_t streams, int64_t dim) {
#pragma omp parallel for schedule(static) if (n * streams * streams * dim >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> old(streams);
    const float* cm = comb + t * streams * streams;
    for (int64_t d = 0; d < dim; ++d) {
      for (int64_t i = 0; i < streams; ++i) old[i] = x[(t * streams + i) * dim + d];
      for (int64_t j = 0; j < streams; ++j) {
        float acc = post[t * streams + j] * y[t * dim + d];
        for (int64_t i = 0; i < streams; ++i) acc += cm[i * streams + j] * old[i];
        x[(t * streams + j) * dim + d] = acc;
      }
    }
  }
}

}  // namespace kiln::cpu

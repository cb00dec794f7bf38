#include "vision_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::vision {

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Four outputs of one row at once: four independent sums keep the FP adder busy where one would wait on itself.
void dot4(const float* a, const float* w, int64_t n, float out[4]) {
  const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    s0 += a[i] * w0[i];
    s1 += a[i] * w1[i];
    s2 += a[i] * w2[i];
    s3 += a[i] * w3[i];
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

}  // namespace

void linear(const float* x, int64_t rows, int64_t in, const float* w, const float* b, int64_t out, float* y) {
  // Blocks of rows share each group of weight rows while it is in cache (the weights are streamed once per block,
  // not once per row). Which code computes output o depends on o alone (groups of four, then the rest), so a row's
  // result does not depend on its block, the batch or the thread.
  constexpr int64_t kRowBlock = 16;
  const int64_t grouped = out / 4 * 4;
#pragma omp parallel for schedule(static)
  for (int64_t first = 0; first < rows; first += kRowBlock) {
    const int64_t last = std::min(rows, first + kRowBlock);
    for (int64_t o = 0; o < grouped; o += 4)
      for (int64_t r = first; r < last; ++r) {
        float acc[4];
        dot4(x + r * in, w + o * in, in, acc);
        for (int k = 0; k < 4; ++k) y[r * out + o + k] = b ? acc[k] + b[o + k] : acc[k];
      }
    for (int64_t o = grouped; o < out; ++o)
      for (int64_t r = first; r < last; ++r) {
        const float acc = dot(x + r * in, w + o * in, in);
        y[r * out + o] = b ? acc + b[o] : acc;
      }
  }
}

void rms_norm(float* x, int64_t rows, int64_t width, const float* w, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * width;
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(width) + eps));
    for (int64_t i = 0; i < width; ++i) xr[i] = w[i] * (xr[i] * inv);
  }
}

void layer_norm(float* x, int64_t rows, int64_t width, const float* w, const float* b, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * width;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < width; ++i) mean += xr[i];
    mean /= static_cast<double>(width);
    for (int64_t i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(width);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < width; ++i) xr[i] = static_cast<float>((xr[i] - mean) * inv) * w[i] + b[i];
  }
}

void clamped_swiglu(float* gate, const float* up, int64_t count, double limit) {
  const float lim = static_cast<float>(limit);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float g = std::min(gate[i], lim);
    const float u = std::clamp(up[i], -lim, lim);
    gate[i] = g / (1.0f + std::exp(-g)) * u;
  }
}

void gelu(float* x, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i)
    x[i] = static_cast<float>(0.5 * x[i] * (1.0 + std::erf(static_cast<double>(x[i]) / std::sqrt(2.0))));
}

void attend_segment(const float* q, const float* k, const float* v, float* out, int64_t len, int64_t dim,
                    int64_t stride, float scale) {
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(len));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < len; ++i) {
      const float* qi = q + i * stride;
      float top = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kj = k + j * stride;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < dim; ++d) s += qi[d] * kj[d];
        p[j] = s * scale;
        top = std::max(top, p[j]);
      }
      double total = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        p[j] = std::exp(p[j] - top);
        total += p[j];
      }
      const float inv = static_cast<float>(1.0 / total);
      float* oi = out + i * stride;
      std::fill(oi, oi + dim, 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        const float pj = p[j] * inv;
        const float* vj = v + j * stride;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) oi[d] += pj * vj[d];
      }
    }
  }
}

}  // namespace kiln::vision

#include "kernels/cpu/norm.h"

#include <cmath>

namespace kiln::cpu {
namespace {

constexpr int64_t kParallelElements = 1 << 14;

void rmsnorm_row(const float* x, const float* weight, int64_t dim, float eps, float* out) {
  double sum_sq = 0.0;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * (x[i] * inv_rms);
}

}  // namespace

void rmsnorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
#pragma omp parallel for schedule(static) if (n * dim >= kParallelElements)
  for (int64_t t = 0; t < n; ++t) rmsnorm_row(x + t * dim, weight, dim, eps, out + t * dim);
}

void add_rmsnorm(const float* x, float* residual, const float* weight, int64_t n, int64_t dim, float eps,
                 float* out) {
#pragma omp parallel for schedule(static) if (n * dim >= kParallelElements)
  for (int64_t t = 0; t < n; ++t) {
    float* r = residual + t * dim;
    const float* xt = x + t * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) r[i] += xt[i];
    rmsnorm_row(r, weight, dim, eps, out + t * dim);
  }
}

void layernorm(const float* x, const float* weight, const float* bias, int64_t n, int64_t dim, float eps,
               float* out) {
#pragma omp parallel for schedule(static) if (n * dim >= kParallelElements)
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * dim;
    float* ot = out + t * dim;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < dim; ++i) sum += xt[i];
    const double mean = sum / static_cast<double>(dim);
    double sum_sq = 0.0;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < dim; ++i) sum_sq += (xt[i] - mean) * (xt[i] - mean);
    const double inv_std = 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) ot[i] = static_cast<float>((xt[i] - mean) * inv_std) * weight[i] + bias[i];
  }
}

}  // namespace kiln::cpu

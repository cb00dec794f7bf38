#include "kernels/cpu/mla_partial_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/vector_ops.h"

namespace kiln::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

void mla_attention_absorbed_partial(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                    const float* rows, const int64_t* keys, int64_t n_keys, float scale, float* out,
                                    float* lse, float* scratch) {
  const int64_t row_dim = latent_dim + rope_dim;
  float* scores = scratch;  // [H, n_keys]
  std::fill(out, out + num_heads * latent_dim, 0.0f);
  std::fill(lse, lse + num_heads, kNegInf);
  if (n_keys == 0) return;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* row = rows + keys[j] * row_dim;
    for (int64_t h = 0; h < num_heads; ++h) scores[h * n_keys + j] = scale * dot(q + h * row_dim, row, row_dim);
  }
  // The softmax of cpu::softmax (row max, fp64 sum, one fp32 reciprocal), keeping what the merge needs.
  for (int64_t h = 0; h < num_heads; ++h) {
    float* s = scores + h * n_keys;
    float max_v = kNegInf;
    for (int64_t j = 0; j < n_keys; ++j) max_v = std::max(max_v, s[j]);
    if (max_v == kNegInf) {
      std::fill(s, s + n_keys, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n_keys; ++j) {
      s[j] = std::exp(s[j] - max_v);
      sum += s[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n_keys; ++j) s[j] *= inv;
    lse[h] = static_cast<float>(static_cast<double>(max_v) + std::log(sum));
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* row = rows + keys[j] * row_dim;
    for (int64_t h = 0; h < num_heads; ++h) axpy(scores[h * n_keys + j], row, out + h * latent_dim, latent_dim);
  }
}

void merge_attention_partials(const float* out_parts, const float* lse_parts, int64_t parts, int64_t rows, int64_t dim,
                              float* out, float* lse) {
#pragma omp parallel for schedule(static) if (parts * rows * dim >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    auto usable = [](float x) { return !std::isnan(x) && x != std::numeric_limits<float>::infinity(); };
    double max_lse = -std::numeric_limits<double>::infinity();
    for (int64_t p = 0; p < parts; ++p) {
      const float x = lse_parts[p * rows + r];
      if (usable(x)) max_lse = std::max(max_lse, static_cast<double>(x));
    }
    float* o = out + r * dim;
    if (max_lse == -std::numeric_limits<double>::infinity()) {
      std::fill(o, o + dim, 0.0f);
      if (lse) lse[r] = kNegInf;
      continue;
    }
    double z = 0.0;
    for (int64_t p = 0; p < parts; ++p) {
      const float x = lse_parts[p * rows + r];
      if (usable(x)) z += std::exp(static_cast<double>(x) - max_lse);
    }
    const double total = max_lse + std::log(z);
    // fp64 accumulation in part order: one rounding per output value, the same on every rank.
    std::vector<double> acc(static_cast<size_t>(dim), 0.0);
    for (int64_t p = 0; p < parts; ++p) {
      const float x = lse_parts[p * rows + r];
      if (!usable(x) || x == kNegInf) continue;
      const double w = std::exp(static_cast<double>(x) - total);
      const float* src = out_parts + (p * rows + r) * dim;
      for (int64_t i = 0; i < dim; ++i) acc[i] += w * src[i];
    }
    for (int64_t i = 0; i < dim; ++i) o[i] = static_cast<float>(acc[i]);
    if (lse) lse[r] = static_cast<float>(total);
  }
}

}  // namespace kiln::cpu

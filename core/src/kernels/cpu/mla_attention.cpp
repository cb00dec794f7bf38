#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu/vector_ops.h"

namespace kiln::cpu {
namespace {

// In-place softmax of n scores (activation.h's softmax reads each element before writing it).
void softmax_in_place(float* s, int64_t n) {
  softmax(s, 1, n, s);
}

}  // namespace

void mla_attention_expanded(const float* q, const float* k, const float* v, int64_t t_q, int64_t t_kv,
                            int64_t num_heads, int64_t qk_dim, int64_t v_dim, float scale, const int32_t* selected,
                            int64_t selected_width, float* out) {
  const int64_t offset = t_kv - t_q;
#pragma omp parallel
  {
    std::vector<int64_t> keys;
    std::vector<float> scores;
    std::vector<char> chosen;
#pragma omp for schedule(dynamic, 4)
    for (int64_t qh = 0; qh < t_q * num_heads; ++qh) {
      const int64_t i = qh / num_heads;
      const int64_t h = qh % num_heads;
      const int64_t last = offset + i;  // inclusive causal limit
      keys.clear();
      if (selected == nullptr) {
        for (int64_t t = 0; t <= last; ++t) keys.push_back(t);
      } else {
        // A position listed twice is still one key.
        chosen.assign(static_cast<size_t>(last + 1), 0);
        for (int64_t j = 0; j < selected_width; ++j) {
          const int32_t p = selected[i * selected_width + j];
          if (p >= 0 && p <= last) chosen[p] = 1;
        }
        for (int64_t t = 0; t <= last; ++t)
          if (chosen[t]) keys.push_back(t);
      }
      float* o = out + (i * num_heads + h) * v_dim;
      std::fill(o, o + v_dim, 0.0f);
      if (keys.empty()) continue;
      const float* qv = q + (i * num_heads + h) * qk_dim;
      scores.resize(keys.size());
      for (size_t j = 0; j < keys.size(); ++j)
        scores[j] = scale * dot(qv, k + (keys[j] * num_heads + h) * qk_dim, qk_dim);
      softmax_in_place(scores.data(), static_cast<int64_t>(keys.size()));
      for (size_t j = 0; j < keys.size(); ++j) axpy(scores[j], v + (keys[j] * num_heads + h) * v_dim, o, v_dim);
    }
  }
}

void mla_absorb_query(const float* q_nope, int64_t n, int64_t in_head_stride, const float* kv_b_weight,
                      const MlaAbsorbDims& d, float* q_lat, int64_t out_head_stride) {
  const int64_t head_rows = d.nope_dim + d.v_dim;
#pragma omp parallel for schedule(static) if (n * d.num_heads * d.nope_dim * d.latent_dim >= (1 << 16))
  for (int64_t th = 0; th < n * d.num_heads; ++th) {
    const int64_t h = th % d.num_heads;
    const float* qn = q_nope + th * in_head_stride;
    const float* w_uk = kv_b_weight + h * head_rows * d.latent_dim;
    float* ql = q_lat + th * out_head_stride;
    std::fill(ql, ql + d.latent_dim, 0.0f);
    for (int64_t r = 0; r < d.nope_dim; ++r) axpy(qn[r], w_uk + r * d.latent_dim, ql, d.latent_dim);
  }
}

void mla_unabsorb_output(const float* o_lat, int64_t n, const float* kv_b_weight, const MlaAbsorbDims& d, float* o) {
  const int64_t head_rows = d.nope_dim + d.v_dim;
#pragma omp parallel for schedule(static) if (n * d.num_heads * d.v_dim * d.latent_dim >= (1 << 16))
  for (int64_t th = 0; th < n * d.num_heads; ++th) {
    const int64_t h = th % d.num_heads;
    const float* ol = o_lat + th * d.latent_dim;
    const float* w_uv = kv_b_weight + (h * head_rows + d.nope_dim) * d.latent_dim;
    float* ot = o + th * d.v_dim;
    for (int64_t r = 0; r < d.v_dim; ++r) ot[r] = dot(w_uv + r * d.latent_dim, ol, d.latent_dim);
  }
}

namespace {

// Shared body of the absorbed kernels; `widen(row_ptr, out, count)` turns cached elements into fp32.
template <class Element, class Widen>
void absorbed_attention(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim, const Element* cache,
                        const int64_t* slots, int64_t n_keys, float scale, float* out, float* scratch, Widen widen) {
  const int64_t row_dim = latent_dim + rope_dim;
  float* scores = scratch;                    // [H, n_keys]
  float* row = scratch + num_heads * n_keys;  // one widened cache row
  std::fill(out, out + num_heads * latent_dim, 0.0f);
  if (n_keys == 0) return;
  // Each cached row is widened once per pass and used by every head.
  for (int64_t j = 0; j < n_keys; ++j) {
    widen(cache + slots[j] * row_dim, row, row_dim);
    for (int64_t h = 0; h < num_heads; ++h) scores[h * n_keys + j] = scale * dot(q + h * row_dim, row, row_dim);
  }
  for (int64_t h = 0; h < num_heads; ++h) softmax_in_place(scores + h * n_keys, n_keys);
  for (int64_t j = 0; j < n_keys; ++j) {
    widen(cache + slots[j] * row_dim, row, latent_dim);
    for (int64_t h = 0; h < num_heads; ++h) axpy(scores[h * n_keys + j], row, out + h * latent_dim, latent_dim);
  }
}

}  // namespace

void mla_attention_absorbed_bf16(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                 const uint16_t* cache, const int64_t* slots, int64_t n_keys, float scale, float* out,
                                 float* scratch) {
  absorbed_attention(q, num_heads, latent_dim, rope_dim, cache, slots, n_keys, scale, out, scratch,
                     [](const uint16_t* in, float* o, int64_t n) { bf16_to_float(in, o, n); });
}

void mla_attention_absorbed_f32(const float* q, int64_t num_heads, int64_t latent_dim, int64_t rope_dim,
                                const float* cache, const int64_t* slots, int64_t n_keys, float scale, float* out,
                                float* scratch) {
  absorbed_attention(q, num_heads, latent_dim, rope_dim, cache, slots, n_keys, scale, out, scratch,
                     [](const float* in, float* o, int64_t n) { std::copy_n(in, n, o); });
}

}  // namespace kiln::cpu

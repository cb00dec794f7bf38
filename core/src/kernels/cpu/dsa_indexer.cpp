#include "kernels/cpu/dsa_indexer.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/topk.h"
#include "kernels/cpu/vector_ops.h"

namespace kiln::cpu {
namespace {

// One (query, key) score: the one arithmetic both scoring entry points share.
inline float index_score(const float* q, const float* k, const float* w, int64_t num_heads, int64_t head_dim,
                         float scale) {
  float total = 0.f;
  for (int64_t h = 0; h < num_heads; ++h) {
    const float logit = dot(q + h * head_dim, k, head_dim) * scale;
    total += w[h] * std::max(logit, 0.0f);
  }
  return total;
}

}  // namespace

void dsa_indexer_scores(const float* q, const float* k, const float* w, int64_t t_q, int64_t t_kv, int64_t num_heads,
                        int64_t head_dim, float scale, float* scores) {
  const int64_t offset = t_kv - t_q;
#pragma omp parallel for schedule(dynamic, 1) if (t_q * t_kv * num_heads * head_dim >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    float* row = scores + s * t_kv;
    const int64_t visible = std::min(t_kv, offset + s + 1);
    for (int64_t t = 0; t < visible; ++t)
      row[t] = index_score(q + s * num_heads * head_dim, k + t * head_dim, w + s * num_heads, num_heads, head_dim, scale);
    std::fill(row + visible, row + t_kv, -std::numeric_limits<float>::infinity());
  }
}

void dsa_indexer_scores_at(const float* q, const float* k, const int64_t* key_positions, const float* w, int64_t t_q,
                           int64_t first_query_position, int64_t n_keys, int64_t num_heads, int64_t head_dim,
                           float scale, float* scores) {
#pragma omp parallel for schedule(dynamic, 1) if (t_q * n_keys * num_heads * head_dim >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    float* row = scores + s * n_keys;
    for (int64_t j = 0; j < n_keys; ++j)
      row[j] = key_positions[j] <= first_query_position + s
                   ? index_score(q + s * num_heads * head_dim, k + j * head_dim, w + s * num_heads, num_heads,
                                 head_dim, scale)
                   : -std::numeric_limits<float>::infinity();
  }
}

int64_t dsa_select_topk(const float* scores, int64_t t_q, int64_t t_kv, int64_t index_topk, int32_t* out) {
  const int64_t offset = t_kv - t_q;
  int64_t tied_rows = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : tied_rows) if (t_q * t_kv >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    const float* row = scores + s * t_kv;
    const int64_t visible = std::min(t_kv, offset + s + 1);
    int32_t* o = out + s * index_topk;
    // As transformers: top min(index_topk, t_kv) of the whole row, the keys after the query masked (−inf here,
    // −FLT_MAX or −inf there: the same order), then only the visible ones kept.
    const int64_t k = std::min(index_topk, t_kv);
    std::vector<int32_t> picked(static_cast<size_t>(k));
    torch_cpu_topk_indices(row, t_kv, k, picked.data());
    int64_t kept = 0;
    for (int32_t t : picked)
      if (t < visible) o[kept++] = t;
    std::fill(o + kept, o + index_topk, -1);
    if (kept <= 0 || kept == visible) continue;
    // The last key kept has the lowest score kept; the cut is ambiguous when more visible keys score exactly that
    // than were kept.
    float cut = row[o[0]];
    for (int64_t j = 1; j < kept; ++j) cut = std::min(cut, row[o[j]]);
    int64_t kept_at_cut = 0, at_cut = 0;
    for (int64_t j = 0; j < kept; ++j) kept_at_cut += row[o[j]] == cut;
    for (int64_t t = 0; t < visible; ++t) at_cut += row[t] == cut;
    tied_rows += at_cut > kept_at_cut;
  }
  return tied_rows;
}

}  // namespace kiln::cpu

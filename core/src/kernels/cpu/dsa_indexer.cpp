#include "kernels/cpu/dsa_indexer.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/topk.h"
#include "kernels/cpu/vector_ops.h"
#include "kiln/indexer_key_codec.h"
#include "kiln/indexer_key_format.h"

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

// index_score for an fp8 key row: the codes widened into `codes` (head_dim floats), the key's scale applied to each
// head's dot product.
inline float index_score_fp8(const float* q, const uint8_t* row, const float* w, int64_t num_heads, int64_t head_dim,
                             float scale, float* codes) {
  for (int64_t i = 0; i < head_dim; ++i) codes[i] = e4m3_to_float(row[i]);
  const float key_scale = indexer_key_fp8_scale(row, head_dim);
  float total = 0.f;
  for (int64_t h = 0; h < num_heads; ++h) {
    const float logit = dot(q + h * head_dim, codes, head_dim) * key_scale * scale;
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

void dsa_indexer_scores_fp8(const float* q, const uint8_t* k_rows, const float* w, int64_t t_q, int64_t t_kv,
                            int64_t num_heads, int64_t head_dim, float scale, float* scores) {
  const int64_t offset = t_kv - t_q;
  const int64_t row_bytes = static_cast<int64_t>(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, head_dim));
#pragma omp parallel for schedule(dynamic, 1) if (t_q * t_kv * num_heads * head_dim >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    std::vector<float> codes(static_cast<size_t>(head_dim));
    float* row = scores + s * t_kv;
    const int64_t visible = std::min(t_kv, offset + s + 1);
    for (int64_t t = 0; t < visible; ++t)
      row[t] = index_score_fp8(q + s * num_heads * head_dim, k_rows + t * row_bytes, w + s * num_heads, num_heads,
                               head_dim, scale, codes.data());
    std::fill(row + visible, row + t_kv, -std::numeric_limits<float>::infinity());
  }
}

void dsa_indexer_scores_fp8_at(const float* q, const uint8_t* k_rows, const int64_t* key_positions, const float* w,
                               int64_t t_q, int64_t first_query_position, int64_t n_keys, int64_t num_heads,
                               int64_t head_dim, float scale, float* scores) {
  const int64_t row_bytes = static_cast<int64_t>(indexer_key_row_bytes(IndexerKeyFormat::kFp8E4m3Scaled, head_dim));
#pragma omp parallel for schedule(dynamic, 1) if (t_q * n_keys * num_heads * head_dim >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    std::vector<float> codes(static_cast<size_t>(head_dim));
    float* row = scores + s * n_keys;
    for (int64_t j = 0; j < n_keys; ++j)
      row[j] = key_positions[j] <= first_query_position + s
                   ? index_score_fp8(q + s * num_heads * head_dim, k_rows + j * row_bytes, w + s * num_heads,
                                     num_heads, head_dim, scale, codes.data())
                   : -std::numeric_limits<float>::infinity();
  }
}

int64_t dsa_select_topk(const float* scores, int64_t t_q, int64_t t_kv, int64_t index_topk, int32_t* out,
                        const int64_t* row_lengths) {
  const int64_t offset = t_kv - t_q;
  int64_t tied_rows = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : tied_rows) if (t_q * t_kv >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s) {
    const float* row = scores + s * t_kv;
    const int64_t visible = std::min(t_kv, offset + s + 1);
    int32_t* o = out + s * index_topk;
    // As transformers: top min(index_topk, R) of the whole row, the keys after the query masked (−inf here,
    // −FLT_MAX or −inf there: the same order), then only the visible ones kept.
    const int64_t length = row_lengths ? std::max(row_lengths[s], visible) : t_kv;
    std::vector<float> resized;
    const float* ranked = row;
    if (length != t_kv) {  // the same masked tail, shorter or longer
      resized.assign(static_cast<size_t>(length), -std::numeric_limits<float>::infinity());
      std::copy_n(row, std::min(length, t_kv), resized.begin());
      ranked = resized.data();
    }
    const int64_t k = std::min(index_topk, length);
    std::vector<int32_t> picked(static_cast<size_t>(k));
    torch_cpu_topk_indices(ranked, length, k, picked.data());
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

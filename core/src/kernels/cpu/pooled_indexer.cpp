#include "kernels/cpu/pooled_indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/topk.h"
#include "kernels/cpu/vector_ops.h"

namespace kiln::cpu {

void pooled_indexer_pool_key(const float* k, const float* gate, const float* ape, int64_t pool, int64_t dim,
                             float* key) {
  for (int64_t c = 0; c < dim; ++c) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < pool; ++j) mx = std::max(mx, gate[j * dim + c] + ape[j * dim + c]);
    float sum = 0.f, acc = 0.f;
    for (int64_t j = 0; j < pool; ++j) {
      const float e = std::exp(gate[j * dim + c] + ape[j * dim + c] - mx);
      sum += e;
      acc += e * k[j * dim + c];
    }
    key[c] = acc / sum;
  }
}

void pooled_indexer_scores(const float* q, const float* w, const float* pool_keys, int64_t t_q, int64_t num_pools,
                           int64_t heads, int64_t dim, float scale, float* scores) {
#pragma omp parallel for schedule(static) if (t_q * num_pools * heads * dim >= (1 << 16))
  for (int64_t s = 0; s < t_q; ++s)
    for (int64_t p = 0; p < num_pools; ++p) {
      float total = 0.f;
      for (int64_t h = 0; h < heads; ++h) {
        const float logit = dot(q + (s * heads + h) * dim, pool_keys + p * dim, dim) * scale;
        total += w[s * heads + h] * std::max(logit, 0.0f);
      }
      scores[s * num_pools + p] = total;
    }
}

void pooled_indexer_select(const float* scores, int64_t num_pools, int64_t q_pos, int64_t pool, int64_t index_topk,
                           bool select_tail, int32_t* out, int64_t width, PoolTies ties, int64_t row_pools) {
  std::fill(out, out + width, -1);
  const int64_t visible = q_pos + 1;
  const int64_t candidates = std::min(num_pools, visible / pool);  // pools ending at or before q_pos
  // As transformers: torch.topk(min(index_topk / pool, num_pools)) over every complete pool's score, the pools the
  // query cannot see set to the lowest float, then only candidates kept. Same procedure as torch on the CPU
  // (topk.h), so the same pools are kept when scores tie exactly at the cut.
  std::vector<int32_t> top;
  if (ties == PoolTies::kTorchCpu) {
    const int64_t length = row_pools >= 0 ? std::max(row_pools, candidates) : num_pools;
    const int64_t k = std::min(index_topk / pool, length);
    std::vector<float> row(static_cast<size_t>(length), std::numeric_limits<float>::lowest());
    std::copy_n(scores, std::min(candidates, length), row.begin());  // the rest: not visible to the query
    top.resize(k);
    torch_cpu_topk_indices(row.data(), length, k, top.data());
  } else {
    top.resize(std::min(index_topk / pool, candidates));
    topk_indices(scores, candidates, static_cast<int64_t>(top.size()), top.data());
  }
  int64_t o = 0;
  for (int32_t p : top) {
    if (p >= candidates) continue;
    for (int64_t j = 0; j < pool && o < width; ++j) out[o++] = static_cast<int32_t>(p * pool + j);
  }
  if (!select_tail) return;
  const int64_t tail = visible % pool;
  for (int64_t pos = visible - tail; pos < visible && o < width; ++pos) out[o++] = static_cast<int32_t>(pos);
}

}  // namespace kiln::cpu

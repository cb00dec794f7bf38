#include <algorithm>
#include "kernels/cpu/moe_router.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/topk.h"

namespace kiln::cpu {

void moe_route(const float* logits, const float* bias, int64_t n, const MoeRouterConfig& c, int32_t* ids,
               float* weights, float* margin) {
  const int64_t experts = c.num_experts;
  const int64_t group_size = experts / c.n_group;
#pragma omp parallel for schedule(static) if (n * experts >= (1 << 14))
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> probs(static_cast<size_t>(experts));
    std::vector<float> choice(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      probs[e] = 1.0f / (1.0f + std::exp(-logits[t * experts + e]));
      choice[e] = probs[e] + (bias ? bias[e] : 0.0f);
    }
    if (c.n_group > 1 && c.topk_group < c.n_group) {
      std::vector<float> group_scores(static_cast<size_t>(c.n_group));
      int32_t best_two[2];
      for (int64_t g = 0; g < c.n_group; ++g) {
        topk_indices(choice.data() + g * group_size, group_size, 2, best_two);
        group_scores[g] = choice[g * group_size + best_two[0]] + choice[g * group_size + best_two[1]];
      }
      std::vector<int32_t> kept(static_cast<size_t>(c.topk_group));
      topk_indices(group_scores.data(), c.n_group, c.topk_group, kept.data());
      std::vector<char> keep(static_cast<size_t>(c.n_group), 0);
      for (int32_t g : kept) keep[g] = 1;
      if (margin) {
        float best_out = -std::numeric_limits<float>::infinity();
        for (int64_t g = 0; g < c.n_group; ++g)
          if (!keep[g]) best_out = std::max(best_out, group_scores[g]);
        margin[t] = std::min(margin[t], group_scores[kept[c.topk_group - 1]] - best_out);
      }
      for (int64_t e = 0; e < experts; ++e)
        if (!keep[e / group_size]) choice[e] = -std::numeric_limits<float>::infinity();
    }
    int32_t* id = ids + t * c.top_k;
    float* w = weights + t * c.top_k;
    topk_indices(choice.data(), experts, c.top_k, id);
    if (margin) {
      float best_out = -std::numeric_limits<float>::infinity();
      for (int64_t e = 0; e < experts; ++e)
        if (std::find(id, id + c.top_k, static_cast<int32_t>(e)) == id + c.top_k) best_out = std::max(best_out, choice[e]);
      if (std::isfinite(best_out)) margin[t] = std::min(margin[t], choice[id[c.top_k - 1]] - best_out);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < c.top_k; ++j) {
      w[j] = probs[id[j]];
      sum += w[j];
    }
    const float denominator = c.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int64_t j = 0; j < c.top_k; ++j) w[j] = w[j] / denominator * c.routed_scaling_factor;
  }
}

}  // namespace kiln::cpu

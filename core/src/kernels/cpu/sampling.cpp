#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/token_select.h"
#include "kernels/cpu/topk.h"

namespace kiln::cpu {

int32_t argmax(const float* logits, int64_t vocab) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > best_v) {
      best = static_cast<int32_t>(i);
      best_v = logits[i];
      found = true;
    }
  }
  return best;
}

void sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params, float* probs) {
  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  const int64_t kept_count = use_top_k ? params.top_k : vocab;
  std::vector<int32_t> kept(static_cast<size_t>(kept_count));
  if (use_top_k || use_top_p) {
    // Candidates ordered by logit descending, ties by lower index: this is also probability order.
    topk_indices(logits, vocab, kept_count, kept.data());
  } else {
    std::iota(kept.begin(), kept.end(), 0);  // no restriction: skip the O(V log V) sort
  }

  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  const double max_scaled = static_cast<double>(logits[argmax(logits, vocab)]) * inv_t;
  std::vector<double> weight(kept.size());
  double total = 0.0;
  for (size_t j = 0; j < kept.size(); ++j) {
    weight[j] = std::exp(static_cast<double>(logits[kept[j]]) * inv_t - max_scaled);
    total += weight[j];
  }

  size_t keep = kept.size();
  if (use_top_p) {
    double mass = 0.0;
    keep = 0;
    while (keep < kept.size() && (keep == 0 || mass < params.top_p)) mass += weight[keep++] / total;
  }
  double kept_total = 0.0;
  for (size_t j = 0; j < keep; ++j) kept_total += weight[j];

  std::fill(probs, probs + vocab, 0.0f);
  for (size_t j = 0; j < keep; ++j) probs[kept[j]] = static_cast<float>(weight[j] / kept_total);
}

int32_t sample_from_distribution(const float* probs, int64_t vocab, std::mt19937_64& rng) {
  return sample_from_distribution_u(probs, vocab, uniform_53(rng));
}

int32_t sample(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng) {
  if (params.temperature <= 0.0f || params.top_k == 1) return argmax(logits, vocab);
  std::vector<float> probs(static_cast<size_t>(vocab));
  sampling_distribution(logits, vocab, params, probs.data());
  return sample_from_distribution(probs.data(), vocab, rng);
}

}  // namespace kiln::cpu

#include "engine/speculative_sampling.h"

#include <algorithm>
#include <vector>

namespace kiln {

Verification verify_greedy(const float* target_logits, int64_t vocab, std::span<const int32_t> drafts) {
  Verification v;
  const int64_t K = static_cast<int64_t>(drafts.size());
  for (int64_t i = 0; i <= K; ++i) {
    const int32_t target = cpu::argmax(target_logits + i * vocab, vocab);
    v.tokens.push_back(target);
    if (i == K || drafts[i] != target) break;
    ++v.accepted;
  }
  return v;
}

Verification verify_sampling(const float* target_logits, int64_t vocab, std::span<const int32_t> drafts,
                             const float* draft_probs, const cpu::SamplingParams& params, std::mt19937_64& rng) {
  Verification v;
  const int64_t K = static_cast<int64_t>(drafts.size());
  std::vector<float> p(vocab), residual(vocab);
  for (int64_t i = 0; i < K; ++i) {
    cpu::sampling_distribution(target_logits + i * vocab, vocab, params, p.data());
    const int32_t x = drafts[i];
    const float* q = draft_probs ? draft_probs + i * vocab : nullptr;
    const double qx = q ? q[x] : 1.0;
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    // u < p/q without dividing: q(x) = 0 (a draft its own distribution never proposes) accepts iff p(x) > 0.
    if (u * qx < static_cast<double>(p[x])) {
      v.tokens.push_back(x);
      ++v.accepted;
      continue;
    }
    double mass = 0;
    for (int64_t t = 0; t < vocab; ++t) {
      const float qt = q ? q[t] : (t == x ? 1.0f : 0.0f);
      residual[t] = std::max(p[t] - qt, 0.0f);
      mass += residual[t];
    }
    // A rejection implies p(x) < q(x), hence p ≠ q and positive residual mass; rounding can still leave none.
    v.tokens.push_back(cpu::sample_from_distribution(mass > 0 ? residual.data() : p.data(), vocab, rng));
    return v;
  }
  cpu::sampling_distribution(target_logits + K * vocab, vocab, params, p.data());
  v.tokens.push_back(cpu::sample_from_distribution(p.data(), vocab, rng));
  return v;
}

}  // namespace kiln

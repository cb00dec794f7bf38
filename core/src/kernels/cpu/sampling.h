// Token selection from one row of logits.
//
// Order of operations (as in Hugging Face generate's warpers): temperature, then top-k, then top-p, then
// the draw. Random numbers come only from the caller's std::mt19937_64, one 64-bit draw per sampled token
// (none for greedy), turned into u ∈ [0, 1) with 53 bits, so a seed reproduces a sequence exactly on any
// platform (std::uniform_real_distribution is not portable across standard libraries).
#pragma once

#include <cstdint>
#include <random>

namespace kiln::cpu {

// The index of the largest logit; the lowest index among equal maxima. NaN never wins.
int32_t argmax(const float* logits, int64_t vocab);

struct SamplingParams {
  float temperature = 1.0f;  // ≤ 0: greedy
  int64_t top_k = 0;         // ≤ 0 or ≥ vocab: off
  float top_p = 1.0f;        // ≥ 1: off
};

// The distribution a non-greedy `sample` draws from (temperature > 0), written to probs [vocab]:
// softmax(logits / temperature) restricted to the top_k largest logits (ties by lower index), then to the
// shortest prefix of those, by probability descending (ties by lower index), whose mass reaches top_p
// (a token is kept while the mass before it is < top_p; at least one token), renormalised. Zero elsewhere.
void sampling_distribution(const float* logits, int64_t vocab, const SamplingParams& params, float* probs);

// Draws from a distribution (not necessarily normalised): u ∈ [0, 1) from one rng() call, then the first
// index, in index order, where the running sum exceeds u · Σ probs.
int32_t sample_from_distribution(const float* probs, int64_t vocab, std::mt19937_64& rng);

// Greedy (argmax, no rng draw) when temperature ≤ 0 or top_k == 1; otherwise sampling_distribution + draw.
int32_t sample(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace kiln::cpu

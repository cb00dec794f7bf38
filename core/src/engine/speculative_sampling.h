// Verification of K draft tokens against the target's logits for the 1 + K positions it ran in one pass
// (row i = the target's logits after the newest token and drafts 1..i, i.e. its distribution for draft i+1).
//
// Greedy: accept drafts while each equals the target's argmax; the first mismatch emits the target's argmax
// instead; if all K match, the last row's argmax is a bonus token. Output equals non-speculative greedy.
//
// Sampling (Leviathan et al. 2023, lossless): p = the target's sampling distribution (temperature → top-k →
// top-p, kiln::cpu::sampling_distribution), q = the draft distribution (one-hot at the draft when the drafter
// drafted greedily). Accept draft x with probability min(1, p(x)/q(x)); on the first rejection emit a sample
// of norm(max(p − q, 0)); if all K are accepted emit a bonus sample of the last row's p. Every emitted token is
// then distributed exactly as the target's own sampling would be.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kernels/cpu/sampling.h"

namespace kiln {

struct Verification {
  std::vector<int32_t> tokens;  // accepted drafts, then the correction or bonus token: accepted + 1 tokens
  int64_t accepted = 0;         // drafts accepted (a prefix of the K)
};

// target_logits: [drafts.size() + 1, vocab].
Verification verify_greedy(const float* target_logits, int64_t vocab, std::span<const int32_t> drafts);

// draft_probs: [drafts.size(), vocab] q rows, or null for greedy (one-hot) drafts. Draws come from `rng`:
// one 53-bit uniform per examined draft, then one draw for the correction or bonus token. Needs
// params.temperature > 0 (verify_greedy otherwise).
Verification verify_sampling(const float* target_logits, int64_t vocab, std::span<const int32_t> drafts,
                             const float* draft_probs, const cpu::SamplingParams& params, std::mt19937_64& rng);

}  // namespace kiln

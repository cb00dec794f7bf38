// Token selection for one decode step, from the target's logits: plain sampling (or argmax) of one token, and
// verification of speculative drafts (greedy, or Leviathan et al. rejection sampling, which is lossless), with the
// random numbers drawn up front by the caller. Also the drafters' own step: a draft token and its sparse draft
// distribution q. This is the CPU reference of kernels/cuda/token_select.h; the argument structs below are shared by
// both, their pointers being host memory here and device memory there.
//
// Distributions follow cpu::sampling_distribution (temperature, then top-k, then the top-p nucleus, renormalised) and
// draws follow cpu::sample_from_distribution with a given u (sample_from_distribution_u below).
#pragma once

#include <cstdint>
#include <random>

#include "kiln/status.h"

namespace kiln::cpu {

// A sequence's sampling settings. Greedy when temperature ≤ 0 or top_k == 1; top_k ≤ 0 (or ≥ vocab) is off;
// top_p ≥ 1 is off.
struct SelectParams {
  float temperature;
  int32_t top_k;
  float top_p;
};

// One sequence's rows in a step. Rows first_row .. first_row + num_drafts of SelectArgs::logits hold the target's
// logits after its newest token and after each of its num_drafts drafts (num_drafts = 0: plain sampling of one token
// from row first_row).
struct SelectSeq {
  int32_t first_row;
  int32_t num_drafts;    // K, 0 ≤ K ≤ SelectArgs::max_drafts
  int32_t draft_offset;  // its first draft in SelectArgs::drafts (and its first row of q); unread when K = 0
  int32_t u_offset;      // its first uniform: K acceptance draws, then the draw of the correction / bonus / plain
                         // sample (K + 1 in all); unread when the params are greedy
  SelectParams params;
};

inline constexpr int64_t kMaxQWidth = 256;

// Sampled verification: draft x_i (row i) is accepted iff u[i] · q_i(x_i) < p_i(x_i), p_i = the row's sampling
// distribution; the first rejection emits a draw with u[K] from norm(max(p_i − q_i, 0)) (from p_i when rounding leaves
// no residual mass); all K accepted: a bonus draw from p_K with u[K]. Greedy verification: drafts are accepted while
// each equals its row's argmax (lowest index among equal maxima, NaN never wins); the first mismatch emits the argmax;
// all accepted: the argmax of row K as bonus. A sampled row whose largest logit is not finite, or that holds NaN,
// has no defined distribution (as in cpu::sampling_distribution).
struct SelectArgs {
  const float* logits;  // [rows, vocab] fp32; rows cover every sequence's first_row + num_drafts
  int64_t vocab;        // 1 ≤ vocab < 2^31
  const SelectSeq* seqs;
  int64_t num_seqs;
  const int32_t* drafts;  // [Σ K] ids in [0, vocab); may be null when max_drafts = 0
  // Sparse draft distributions, one row per draft: q_width candidate ids (−1 = unused slot; the others distinct and in
  // [0, vocab)) and their probabilities (≥ 0); q(x) = 0 for ids not listed. q_ids == nullptr: the drafts were greedy
  // (q is one-hot at the draft) and q_probs / q_width are unread. 1 ≤ q_width ≤ kMaxQWidth otherwise.
  const int32_t* q_ids;
  const float* q_probs;
  int64_t q_width;
  const double* uniforms;  // in [0, 1), drawn by the caller (uniform_53); may be null when every sequence is greedy
  int32_t* tokens;         // [num_seqs, max_drafts + 1]: accepted drafts, then the correction / bonus token, then −1
  int32_t* accepted;       // [num_seqs]: drafts accepted (a prefix), so accepted + 1 tokens are valid
  int64_t max_drafts;      // ≥ every sequence's K: tokens' row stride is max_drafts + 1 (the GPU
                           // also runs that many row slots per sequence, so keep it tight)
};

// A drafter's step: per row, a draft token and the sparse q the verifier reads (SelectArgs::q_ids / q_probs).
struct DraftSampleArgs {
  const float* logits;  // [rows, vocab] fp32
  int64_t rows;
  int64_t vocab;              // 1 ≤ vocab < 2^31
  const float* temperatures;  // [rows]; ≤ 0: the token is the argmax and the q row is left empty
  const double* uniforms;     // [rows] in [0, 1); read only for rows with temperature > 0 (may be null if none)
  int64_t q_width;            // C, 1 ≤ C ≤ kMaxQWidth
  int32_t* tokens;  // [rows]: the argmax, or a draw from q with the row's uniform (sample_from_distribution_u)
  // [rows, C]: q = softmax(logits / T) restricted to the C largest logits (ties by lower index), renormalised, i.e.
  // sampling_distribution with top_k = C; its min(C, vocab) ids in ascending order, then −1 slots with probability 0.
  int32_t* q_ids;
  float* q_probs;
};

// u ∈ [0, 1) from one rng() call, with 53 bits: the draw cpu::sample_from_distribution makes, so a seed gives the
// same tokens here, on the GPU and through cpu::sample.
double uniform_53(std::mt19937_64& rng);

// cpu::sample_from_distribution with the uniform given: the first index, in index order, whose running sum (skipping
// zeros) exceeds u · Σ probs; the last nonzero index when rounding leaves the sum short of that.
int32_t sample_from_distribution_u(const float* probs, int64_t vocab, double u);

Status select_tokens(const SelectArgs& args);
Status sample_drafts(const DraftSampleArgs& args);

}  // namespace kiln::cpu
